"""Shared test fixtures.

Under ``CI=true`` a test that would skip because a tool or package is missing
fails instead, so a missing install step in ``.ci/run`` can never hide behind a
skip. Only tests marked ``gpu`` may skip in CI.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from medrt.allocator import limit_arenas

# The suite runs in one process, and each test that analyses makes (and frees) its own
# models and thread pools: under glibc's default of eight malloc arenas per core the
# process kept what each freed, and two test files in one run were killed for memory on a
# 24 GiB machine. Capped here, at import, before any test starts a thread, however pytest
# was started (`make test`, an IDE, a bare `python -m pytest`); MALLOC_ARENA_MAX in the
# environment wins. medrt.cli.main does the same for the commands tests start.
limit_arenas()

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parent.parent
SAMPLE_DIR = REPO / "sample_dicom"


def pytest_configure(config: pytest.Config) -> None:
    """Tests (and the medrt commands they start) cache TensorRT engines and INT8 models
    in a throw-away folder, never in the user's ~/.cache/medrt."""
    import tempfile

    if "MEDRT_CACHE" not in os.environ:
        config._medrt_cache = tempfile.mkdtemp(prefix="medrt-test-cache-")  # type: ignore[attr-defined]
        os.environ["MEDRT_CACHE"] = config._medrt_cache  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_medrt_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("MEDRT_CACHE", None)


@pytest.fixture(autouse=True)
def _small_accuracy_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accuracy gate's default frames (about a hundred lesions per modality, most of a
    minute per model; README, Performance) are measured by hand: a test that makes an INT8
    twin through the cache gates it on one CT series and three radiographs (the frames
    ``medrt.engine.gate.validation_frames()`` gives the gate tests)."""
    from medrt.engine import gate

    monkeypatch.setattr(gate, "DEFAULT_SET", gate.GateSet(ct_series=1, radiographs=3, nodules=None))


def missing(reason: str) -> None:
    """Skip locally, fail in CI: for a tool or package the test environment should have."""
    if IN_CI:
        pytest.fail(f"required in CI but missing: {reason}")
    pytest.skip(reason)


_FROM_ENVIRONMENT = {"dciodvfy"}


def require_tool(name: str) -> str:
    """Return the path of executable ``name``, or skip (fail in CI) when it is not installed.
    dicom3tools' come from this Python's environment first (the dev extra's, newer than the
    distributions' package), then from PATH; the others from PATH only (pynetdicom installs
    a ``storescu`` of its own there, which is not DCMTK's)."""
    here = Path(sys.executable).parent / name
    path = str(here) if name in _FROM_ENVIRONMENT and os.access(here, os.X_OK) else shutil.which(name)
    if path is None:
        missing(f"executable {name!r} is not installed (see .ci/run for the apt package, pyproject.toml's dev extra for dciodvfy)")
    return path  # type: ignore[return-value]


def require_module(name: str):  # type: ignore[no-untyped-def]
    """Import and return module ``name``, or skip (fail in CI) when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"python package {name!r} is not importable: {exc}")


def pydicom_test_dir() -> Path:
    """The folder of DICOM files that ship inside pydicom's wheel (no download needed)."""
    import pydicom.data

    return Path(pydicom.data.__file__).parent / "test_files"


def pynetdicom_test_dir() -> Path:
    """The folder of DICOM files that ship inside pynetdicom's wheel."""
    import pynetdicom

    return Path(pynetdicom.__file__).parent / "tests" / "dicom_files"


def bundled_dicom_files() -> list[Path]:
    """Every ``*.dcm`` file bundled in the pydicom and pynetdicom wheels, sorted.

    Listed from disk: ``pydicom.data.get_testdata_files`` would try to download
    the files that are not in the wheel, and this machine is offline.
    """
    files = sorted(pydicom_test_dir().glob("*.dcm")) + sorted(pynetdicom_test_dir().glob("*.dcm"))
    assert len(files) > 60, "pydicom/pynetdicom test files not found"
    return files


#: Three sample CT slices, 5 mm apart: a pass of them spans 10 mm, so its end is within reach
#: (medrt.analysis.slices.MAX_GAP_MM) of the next pass's start, and where one pass is taken
#: for the other's neighbour it shows. Replayed head first (by name: medrt stream, the
#: viewer), the first pass's last slice (ct_0014) took the second's first as its head-side
#: neighbour, and the lite UNet then misses its lesion.
TWO_PASS_SLICES = ("ct_0012.dcm", "ct_0013.dcm", "ct_0014.dcm")
#: The same for the batch's order (feet first: medrt.io.series.slice_order): the first
#: pass's last slice (ct_0009) took the second's first as its feet-side neighbour, and the
#: lite UNet then misses its lesion.
TWO_PASS_SLICES_FEET_FIRST = ("ct_0009.dcm", "ct_0010.dcm", "ct_0011.dcm")


def two_pass_series(folder: Path, names: tuple[str, ...] = TWO_PASS_SLICES) -> tuple[list[Path], list[Path]]:
    """The sample CT slices ``names`` written to ``folder`` twice in one series, as a pre- and
    a post-contrast pass at the same positions (medrt.io.stacks): ``a_*`` with
    AcquisitionNumber 1, ``b_*`` with AcquisitionNumber 2, new SOPInstanceUIDs and
    InstanceNumber + 100; by name, the first pass then the second. Returns both passes' files."""
    import pydicom
    from pydicom.uid import generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    first, second = [], []
    for name in names:
        ds = pydicom.dcmread(SAMPLE_DIR / "ct_stream" / name)
        ds.AcquisitionNumber = 1
        ds.save_as(folder / f"a_{name}", enforce_file_format=True)
        first.append(folder / f"a_{name}")
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.AcquisitionNumber, ds.InstanceNumber = 2, int(ds.InstanceNumber) + 100
        ds.save_as(folder / f"b_{name}", enforce_file_format=True)
        second.append(folder / f"b_{name}")
    return first, second


@pytest.fixture
def sample_dir() -> Path:
    if not SAMPLE_DIR.is_dir() or not any(SAMPLE_DIR.rglob("*.dcm")):
        pytest.fail("sample_dicom/ is missing or empty; regenerate it (see sample_dicom/README.md)")
    return SAMPLE_DIR


@pytest.fixture
def bot(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """pytest-qt's qtbot for the viewer tests; skips locally (fails in CI) without PySide6 or pytest-qt."""
    require_module("PySide6.QtWidgets")
    require_module("pytestqt")
    return request.getfixturevalue("qtbot")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def run_storescp(folder: Path, *options: str, ae_title: str = "PACS"):  # type: ignore[no-untyped-def]
    """DCMTK's storescp, writing what it receives into ``folder``, with ``options`` (its
    default accepts the uncompressed transfer syntaxes only; ``+xa`` every one it knows):
    yields its Destination."""
    from medrt.pacs.scu import Destination

    exe = require_tool("storescp")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen([exe, "-aet", ae_title, *options, "-od", str(folder), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield Destination(ae_title, "127.0.0.1", port)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def storescp(tmp_path):
    """DCMTK's storescp as the destination PACS: (Destination, folder it writes into)."""
    folder = tmp_path / "pacs"
    with run_storescp(folder) as dest:
        yield dest, folder
