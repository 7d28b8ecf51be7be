"""``medrt view`` and ``medrt-viewer`` from the outside: Qt stays out of the core, a missing
PySide6 gets an install hint, and the real window opens and is photographed (offscreen, and
on an X server under Xvfb as CI does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SAMPLE_DIR, require_module, require_tool

pytestmark = pytest.mark.gui

CT = SAMPLE_DIR / "ct_stream"
# ct_0017.dcm (two ground-truth lesions) is image 17 of 40 in slice order (head first).
LESION_IMAGE = 17


def _run(args: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_core_and_command_line_load_no_qt() -> None:
    code = (
        "import sys, medrt, medrt.pipeline, medrt.pipeline.graph, medrt.pipeline.sinks, medrt.io.sources, "
        "medrt.overlay, medrt.cli, medrt.commands.view, medrt_gui, medrt_gui.imaging, medrt_gui.study, "
        "medrt_gui.hotkeys\n"
        "medrt.cli.build_parser()\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'PyQt5', 'PyQt6'))))"
    )
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"Qt was imported: {out.stdout}"


def test_view_without_pyside6_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['PySide6'] = None  # as if PySide6 were not installed\n"
        "from medrt.cli import main\n"
        "sys.exit(main(['view', 'sample_dicom/ct_stream']))"
    )
    out = _run([sys.executable, "-c", code])
    assert out.returncode == 2, out.stdout + out.stderr
    assert "pip install 'medrt[gui]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_view_help_lists_the_modes() -> None:
    out = _run([sys.executable, "-m", "medrt", "view", "--help"])
    assert out.returncode == 0, out.stderr
    for option in ("--replay", "--watch", "--lookahead", "--seg", "--screenshot", "--no-analysis", "--backend"):
        assert option in out.stdout
    out = _run([sys.executable, "-m", "medrt", "view", "sample_dicom/ct_stream", "--lookahead", "1"])
    assert out.returncode == 2 and "--lookahead" in out.stderr and "--watch" in out.stderr  # not a watch
    gui_script = Path(sys.executable).parent / "medrt-viewer"
    if not gui_script.exists():
        pytest.fail("the medrt-viewer GUI script is not installed (pip install -e '.[gui]')")
    out = _run([str(gui_script), "--help"])
    assert out.returncode == 0 and "--replay" in out.stdout, out.stderr


def _check_screenshot(path: Path, out: subprocess.CompletedProcess[str]) -> np.ndarray:
    from PIL import Image

    assert out.returncode == 0, out.stdout + out.stderr
    assert path.is_file(), out.stdout + out.stderr
    with Image.open(path) as img:
        assert img.size[0] >= 800 and img.size[1] >= 500
        rgb = np.asarray(img.convert("RGB")).astype(np.int16)
    assert rgb.std() > 20, "the screenshot is blank"
    return rgb


def _overlay_pixels(rgb: np.ndarray) -> int:
    """Pixels in the lesion palette's first colour (red, 255/64/64) blended at 0.7 over grey."""
    r, g, b = rgb[:, :, 0], rgb[:, :, 1], rgb[:, :, 2]
    return int(((r - g > 60) & (np.abs(g - b) < 30)).sum())


def _blended_pixels(rgb: np.ndarray, color: tuple[int, int, int], alpha: float = 0.7) -> int:
    """Pixels that are ``color`` blended at ``alpha`` over some grey: what is left after taking
    the colour's part away is the same in the three channels."""
    rest = rgb - alpha * np.asarray(color, np.float64)
    spread = rest.max(axis=2) - rest.min(axis=2)
    return int(((spread <= 4) & (rest.min(axis=2) >= -3) & (rest.max(axis=2) <= (1 - alpha) * 255 + 3)).sum())


def _key_of(path: Path) -> str:
    import pydicom

    return str(pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID)


def test_a_screenshot_whose_first_image_is_unreadable_is_taken_once_the_analysis_ends(tmp_path: Path) -> None:
    """The image shown first cannot be read (its pixel data cut off): the window says so,
    and that is the picture, taken once the folder is analysed, not after --timeout."""
    require_module("PySide6.QtWidgets")
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("ct_0015.dcm", "ct_0016.dcm"):
        (folder / name).write_bytes((CT / name).read_bytes())
    data = (CT / "ct_0014.dcm").read_bytes()  # image 1 of the three (head first), shown first
    (folder / "ct_0014.dcm").write_bytes(data[: len(data) // 2])  # a whole header: listed, then fails
    shot = tmp_path / "viewer.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = _run([sys.executable, "-m", "medrt", "view", str(folder), "--screenshot", str(shot),
                "--timeout", "120"], env=env)
    _check_screenshot(shot, out)
    assert "nothing ready to show" not in out.stderr, out.stderr
    assert "image -, 2 frame(s) analysed" in out.stdout, out.stdout  # nothing shown: image 1 is unreadable


def test_an_image_number_past_the_series_is_said_not_silently_clamped(tmp_path: Path) -> None:
    require_module("PySide6.QtWidgets")
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("ct_0015.dcm", "ct_0016.dcm"):
        (folder / name).write_bytes((CT / name).read_bytes())
    shot = tmp_path / "viewer.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = _run([sys.executable, "-m", "medrt", "view", str(folder), "--image", "9", "--no-analysis",
                "--screenshot", str(shot), "--timeout", "60"], env=env)
    _check_screenshot(shot, out)
    assert "medrt view: --image 9: the first series has 2 image(s); showing 2" in out.stderr, out.stderr


def test_screenshot_of_the_viewer_offscreen(tmp_path: Path) -> None:
    require_module("PySide6.QtWidgets")
    shot = tmp_path / "viewer.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    out = _run([sys.executable, "-m", "medrt", "view", str(CT), "--image", str(LESION_IMAGE),
                "--screenshot", str(shot), "--timeout", "240"], env=env)
    rgb = _check_screenshot(shot, out)
    assert "platform offscreen" in out.stdout
    # An opened folder is pictured once all of it is analysed, not just the image shown.
    assert f"{len(list(CT.glob('*.dcm')))} frame(s) analysed" in out.stdout, out.stdout
    assert _overlay_pixels(rgb) > 20, "the lesion overlay is not in the screenshot"


def test_real_window_under_xvfb(tmp_path: Path) -> None:
    """What CI's screenshot step does: an X server, the viewer as an X11 (xcb) window, and a
    picture of that window taken from the X server."""
    require_module("PySide6.QtWidgets")
    xvfb = require_tool("Xvfb")
    read_fd, write_fd = os.pipe()
    server = subprocess.Popen([xvfb, "-displayfd", str(write_fd), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
                              pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as f:
            display = f.readline().strip()  # Xvfb writes its display number once it accepts clients
        assert display.isdigit(), f"Xvfb did not start: {server.stderr.read().decode() if server.stderr else ''}"
        shot = tmp_path / "xvfb.png"
        env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": f":{display}"}
        out = _run([sys.executable, "-m", "medrt", "view", str(CT), "--image", str(LESION_IMAGE), "--preset", "1",
                    "--screenshot", str(shot), "--timeout", "240"], env=env)
        rgb = _check_screenshot(shot, out)
        assert "platform xcb" in out.stdout, out.stdout + out.stderr
        assert _overlay_pixels(rgb) > 20, "the lesion overlay is not in the screenshot"
        # During a live replay the view moves with each result: the picture is taken with
        # the stream held off the view, so the lesion list, the HUD and the image agree.
        shot = tmp_path / "replay.png"
        out = _run([sys.executable, "-m", "medrt", "view", str(CT), "--replay", "30", "--screenshot", str(shot),
                    "--timeout", "240"], env=env)
        _check_screenshot(shot, out)
        shown = re.search(r"shown: (\d+) lesion\(s\) listed, (\d+) in its result", out.stdout)
        assert shown is not None and shown[1] == shown[2], out.stdout + out.stderr
    finally:
        server.terminate()
        server.wait(10)


def test_seg_written_by_medrt_batch_opens_beside_its_source(tmp_path: Path) -> None:
    """``medrt batch`` writes a SEG; ``medrt view SOURCE --seg SEG`` lays it over the images."""
    require_module("PySide6.QtWidgets")
    import shutil

    source = tmp_path / "ct"
    source.mkdir()
    for n in ("ct_0014.dcm", "ct_0015.dcm", "ct_0016.dcm", "ct_0017.dcm"):
        shutil.copy(CT / n, source / n)
    batch = _run([sys.executable, "-m", "medrt", "batch", str(source), "--out", str(tmp_path / "out"), "--quiet"])
    assert batch.returncode == 0, batch.stdout + batch.stderr
    (seg,) = (tmp_path / "out" / "series").glob("*/seg.dcm")
    shot = tmp_path / "seg.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    # ct_0017 is image 4 of these four in slice order (head first); no AI run, so only the
    # SEG is drawn.
    out = _run([sys.executable, "-m", "medrt", "view", str(source), "--seg", str(seg), "--no-analysis",
                "--image", "4", "--screenshot", str(shot)], env=env)
    rgb = _check_screenshot(shot, out)
    # Each lesion's segment in the colour the SEG recommends for it (its outline, at 0.7 over grey).
    from medrt.io.seg import read_seg

    seg_masks = read_seg(seg)
    shown = [n for n in seg_masks.segments if (seg_masks.masks[_key_of(source / "ct_0017.dcm")] == n).any()]
    assert shown and all(_blended_pixels(rgb, seg_masks.colors[n]) > 20 for n in shown), \
        "the SEG layer's colours are not in the screenshot"
