"""``medrt checks``: what an installation can do, and what fails it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from medrt.checks import DECODED_SYNTAXES, failed, run_checks
from medrt.cli import main
from medrt.engine.registry import shipped_models_dir


def test_this_installation_passes_with_a_row_for_every_model_syntax_and_part(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["checks", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True
    rows = {(r["area"], r["item"]): r for r in out["rows"]}
    for name in ("roi_classifier", "roi_classifier_dx", "lesion_unet_lite", "lesion_unet_dx"):  # the defaults
        assert rows[("models", name)]["status"] == "ok" and "sha256 matches" in rows[("models", name)]["detail"]
    for name, ts in DECODED_SYNTAXES:
        assert rows[("decoders", name)]["status"] == "ok" and str(ts) in rows[("decoders", name)]["detail"]
    assert "imagecodecs first" in rows[("decoders", "JPEG-LS Lossless")]["detail"]  # medrt's choice, not pydicom's
    assert rows[("runtime", "analysis runs on")]["status"] == "ok"
    assert rows[("runtime", "onnxruntime")]["status"] == "ok"
    assert rows[("optional", "PySide6-Essentials")]["status"] == "ok"  # the test environment has the viewer
    assert {r["area"] for r in out["rows"]} == {"system", "runtime", "models", "decoders", "encoders", "optional",
                                                 "paths"}
    assert main(["checks", "--model", "lesion_unet"]) == 0
    text = capsys.readouterr().out
    assert "  ok       lesion_unet " in text and text.rstrip().endswith("all required checks passed")
    assert "roi_classifier " not in text  # only the models asked for


def test_a_model_file_that_does_not_match_its_spec_fails_the_check(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    src = shipped_models_dir()
    for name in ("roi_classifier.toml", "roi_classifier.onnx"):
        shutil.copy(src / name, tmp_path / name)
    onnx = tmp_path / "roi_classifier.onnx"
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 0xFF  # one byte changed: a damaged download, a swapped file
    onnx.write_bytes(bytes(data))
    spec = tmp_path / "roi_classifier.toml"
    assert main(["checks", "--model", f"lesion_unet_lite,{spec}"]) == 1
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if "FAILED" in x)
    assert str(spec) in line and "sha256" in line
    assert "1 required check(s) failed: models " in text
    rows = run_checks([str(spec)])
    assert [r.item for r in failed(rows)] == [str(spec)]
    assert main(["checks", "--model", str(tmp_path / "absent.toml"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and [r["area"] for r in out["rows"] if r["status"] == "FAILED"] == ["models"]


def test_a_transfer_syntax_without_a_decoder_fails_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JPEG-LS plugin installed (the real packages cannot be uninstalled here: the
    decoder's table of available plugins is emptied for the test)."""
    from pydicom.pixels import get_decoder
    from pydicom.uid import JPEGLSNearLossless

    decoder = get_decoder(JPEGLSNearLossless)
    monkeypatch.setattr(decoder, "_available", {})
    (row,) = failed(run_checks([]))
    assert (row.area, row.item, row.status) == ("decoders", "JPEG-LS Near-lossless", "missing")
    assert "no decoder installed (pip install pyjpegls)" in row.detail


def test_a_request_this_machine_cannot_meet_says_what_runs_instead(capsys) -> None:  # type: ignore[no-untyped-def]
    from medrt.engine.select import probe

    assert main(["checks", "--backend", "tensorrt", "--model", "roi_classifier"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "analysis runs on" in x)
    if not probe().cuda:  # (on a GPU machine TensorRT may run as asked)
        assert "onnxruntime on CPU" in line and "asked --backend tensorrt" in line and "no CUDA device" in line
