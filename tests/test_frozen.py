"""installer/medrt.spec: medrt and its viewer frozen by PyInstaller into one folder that runs
without Python, built here and used as a site without Python would use it.

The frozen `medrt` must read every bundled test file as the installed medrt does (every
codec plugin is inside), find the same lesions in `sample_dicom/` with worker processes
(multiprocessing's forkserver from a frozen program), answer a C-ECHO as `medrt listen`,
and the frozen viewer must open a series, analyse it and save a screenshot.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLE_DIR, bundled_dicom_files, require_module, require_tool

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def frozen(tmp_path_factory) -> Path:
    require_module("PyInstaller")
    work = tmp_path_factory.mktemp("pyinstaller")
    build = subprocess.run([str(ROOT / "installer" / "build.sh")], capture_output=True, text=True, timeout=1500,
                           env={**os.environ, "PYTHON": sys.executable, "DISTPATH": str(work / "dist"),
                                "WORKPATH": str(work / "build")})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    folder = work / "dist" / "medrt"
    assert (folder / "medrt").is_file() and (folder / "medrt-viewer").is_file()
    return folder


def _info(medrt: list[str], files: list[Path]) -> list[dict[str, object]]:
    run = subprocess.run([*medrt, "info", "--json", *map(str, files)], capture_output=True, text=True, timeout=600)
    rows = json.loads(run.stdout)["files"]
    return [{k: v for k, v in r.items() if k not in ("decode_ms", "path")} for r in rows]


def test_the_frozen_medrt_reads_every_test_file_as_the_installed_one(frozen):
    import medrt

    version = subprocess.run([str(frozen / "medrt"), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"medrt {medrt.__version__}"
    files = bundled_dicom_files()
    mine, theirs = _info([str(frozen / "medrt")], files), _info([sys.executable, "-m", "medrt"], files)
    assert len(mine) == len(files) and mine == theirs
    decoded = {r["transfer_syntax"] for r in mine if r["ok"]}
    for syntax in ("JPEG Baseline (Process 1)", "JPEG-LS Lossless Image Compression", "RLE Lossless",
                   "JPEG 2000 Image Compression (Lossless Only)", "Deflated Explicit VR Little Endian"):
        assert syntax in decoded  # each codec plugin made it into the bundle


def test_the_frozen_medrt_checks_itself(frozen):
    """`medrt checks` in the bundle, as a site's IT runs it after installing: every model
    matches its spec, every syntax has a decoder, and the viewer is there."""
    from medrt.checks import DECODED_SYNTAXES

    run = subprocess.run([str(frozen / "medrt"), "checks", "--json"], capture_output=True, text=True, timeout=300)
    out = json.loads(run.stdout)
    assert run.returncode == 0 and out["ok"], run.stdout
    rows = {(r["area"], r["item"]): r["status"] for r in out["rows"]}
    assert all(rows[("decoders", name)] == "ok" for name, _ in DECODED_SYNTAXES)
    detail = {r["item"]: r["detail"] for r in out["rows"] if r["area"] == "decoders"}
    # imagecodecs's codecs made it in (they release the GIL; pyjpegls would stand in for JPEG-LS)
    assert "imagecodecs first" in detail["JPEG-LS Lossless"] and "imagecodecs" in detail["JPEG XL Lossless"]
    assert rows[("models", "lesion_unet_dx")] == rows[("runtime", "onnxruntime")] == "ok"
    assert rows[("optional", "PySide6-Essentials")] == "ok"


def test_the_frozen_batch_finds_what_the_installed_one_finds(frozen, tmp_path):
    def lesions(out: Path) -> list[tuple[str, int, list[float]]]:
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        return sorted((r["file"], r["frame_index"], [round(les["diameter_mm"], 3) for les in r["lesions"]])
                      for r in rows)

    frozen_run = subprocess.run([str(frozen / "medrt"), "batch", str(SAMPLE_DIR), "--out", str(tmp_path / "a"),
                                 "--processes", "2", "--quiet"], capture_output=True, text=True, timeout=900)
    assert frozen_run.returncode == 0, frozen_run.stdout + frozen_run.stderr[-3000:]
    installed = subprocess.run([sys.executable, "-m", "medrt", "batch", str(SAMPLE_DIR), "--out",
                                str(tmp_path / "b"), "--quiet"], capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    found = lesions(tmp_path / "a")
    assert found == lesions(tmp_path / "b") and sum(len(d) for _, _, d in found) > 10
    assert list((tmp_path / "a").rglob("seg.dcm")) and list((tmp_path / "a").rglob("sr.dcm"))


def test_the_frozen_listener_answers_and_stops(frozen, tmp_path):
    echoscu = require_tool("echoscu")
    proc = subprocess.Popen([str(frozen / "medrt"), "listen", "--spool", str(tmp_path / "spool"), "--bind",
                             "127.0.0.1", "--port", "0", "--min-free", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl-C stops" in line or len(lines) > 100:
                break
        started = re.search(r"MEDRT on 127\.0\.0\.1:(\d+)", "".join(lines))
        assert started, "".join(lines)
        echo = subprocess.run([echoscu, "-aec", "MEDRT", "127.0.0.1", started.group(1)], capture_output=True,
                              text=True, timeout=60)
        assert echo.returncode == 0, echo.stderr
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "medrt listen: stopped" in rest


def test_the_frozen_viewer_analyses_a_series_and_saves_a_screenshot(frozen, tmp_path):
    shot = tmp_path / "viewer.png"
    run = subprocess.run([str(frozen / "medrt-viewer"), str(SAMPLE_DIR / "ct_stream"), "--image", "17",
                          "--screenshot", str(shot), "--timeout", "300"], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "40 frame(s) analysed" in run.stdout and shot.stat().st_size > 10_000
