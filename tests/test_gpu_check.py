"""The prepared GPU check (``benchmarks/gpu_check.py``) runs end to end in its dry run.

GPU machines are lent rarely and by the minute, so the script must not first meet a
broken section there: its ``--dry-run`` runs every section's code on the CPU at tiny
sizes (torch's CPU build for the torch backend's logic, onnxruntime for the analyzer
and CT rows) and must finish with no section reporting an error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_the_gpu_check_dry_run_runs_every_section(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = ["env", "phantoms", "unet_crop", "roi_path", "sliding", "analyzer", "profile", "ct"]
    assert all(name in doc for name in sections) and not doc["skipped"]
    for name in sections:
        rows = doc[name] if isinstance(doc[name], list) else [doc[name]]
        assert rows and not any("error" in row for row in rows), (name, rows)
    # the CT rows are onnxruntime on the CPU here (the torch rows need CUDA), with lesions
    assert [row["backend"] for row in doc["ct"]] == ["onnxruntime"] and doc["ct"][0]["n"] > 0
    assert "Host profile" in (tmp_path / "gpu_check.md").read_text()
    assert doc["env"]["checks"]["failed"] == [] and doc["env"]["checks"]["runs_on"]  # medrt checks, recorded
    # --only runs the sections named, and refuses one it does not know
    only = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--dry-run", "--only",
                           "nonsense", "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert only.returncode == 2 and "unknown sections: nonsense" in only.stderr
