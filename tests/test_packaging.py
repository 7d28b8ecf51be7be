"""The package installs, imports lean, and its command line works from anywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, pydicom_test_dir


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_import_medrt_pulls_in_neither_qt_nor_torch(tmp_path: Path) -> None:
    code = (
        "import sys, medrt, medrt.io.dicom, medrt.io.series, medrt.phantom, medrt.cli\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'PySide6', 'PyQt5', 'PyQt6', 'monai'))\n"
        "print(','.join(bad))"
    )
    out = _run([sys.executable, "-c", code], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_wheel_installs_and_runs_from_any_directory(tmp_path: Path) -> None:
    """A non-editable install (the wheel) carries every subpackage and the models folder."""
    wheel_dir = tmp_path / "wheel"
    build = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(REPO)],
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = wheel_dir.glob("medrt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every package folder under medrt/ is in the wheel (pyproject lists them by hand).
    for init in sorted((REPO / "medrt").rglob("__init__.py")):
        rel = init.relative_to(REPO).as_posix()
        assert rel in names, f"{rel} missing from the wheel: add its package to pyproject.toml"
    assert "medrt/models/__init__.py" in names
    for shipped in sorted((REPO / "models").glob("*")):
        if shipped.suffix in (".onnx", ".toml", ".md", ".pt"):
            assert f"medrt/models/{shipped.name}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "medrt = medrt.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    # Install into a folder of its own and run it with the repository nowhere on the path.
    target = tmp_path / "site"
    inst = _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)], cwd=tmp_path)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    where = _run([sys.executable, "-c", "import medrt; print(medrt.__file__)"], cwd=run_dir, env=env)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr
    info = _run(
        [sys.executable, "-m", "medrt", "info", "--json", str(pydicom_test_dir() / "CT_small.dcm")],
        cwd=run_dir,
        env=env,
    )
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["files"][0]["rows"] == 128


def test_console_script_is_installed() -> None:
    exe = Path(sys.executable).parent / "medrt"
    if not exe.exists():
        pytest.fail("the medrt console script is not installed in this environment (pip install -e .)")
    out = _run([str(exe), "--version"], cwd=REPO)
    assert out.returncode == 0 and out.stdout.startswith("medrt ")
