"""``medrt batch``: findings scored against ground truth, resumability, bad files, valid
DICOM output, and the SEG's geometry against results.jsonl and the phantom."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pydicom
import pytest

from conftest import REPO, SAMPLE_DIR, pydicom_test_dir, require_tool
from medrt.analyzer import load_analyzer
from medrt.batch import EXIT_ERRORS, EXIT_FAILED, EXIT_OK, BatchConfig, OutputOptions, run_batch
from medrt.cli import main

CT = SAMPLE_DIR / "ct_stream"
RADIOGRAPHS = SAMPLE_DIR / "radiographs"


@pytest.fixture(scope="module")
def analyzer():
    return load_analyzer(seg_model="lesion_unet", threads=1)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory, analyzer):
    """One batch run over the whole sample folder, shared by the read-only checks."""
    out = tmp_path_factory.mktemp("batch") / "out"
    summary = run_batch(BatchConfig(SAMPLE_DIR, out, workers=2), analyzer=analyzer)
    return summary, out


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "timings_ms"} for r in records]


def _small_input(tmp_path: Path, n: int = 6) -> Path:
    src = tmp_path / "in"
    (src / "ct").mkdir(parents=True)
    for p in sorted(CT.glob("*.dcm"))[14:14 + n]:  # slices with lesions in the sample
        shutil.copy(p, src / "ct" / p.name)
    return src


def test_sample_findings_score_against_ground_truth(sample_run):
    from medrt.commands.eval import load_truth_tree
    from medrt.evaluation import evaluate, load_predictions

    summary, out = sample_run
    assert summary.exit_code == EXIT_OK and summary.frames == 43 and summary.series == 4
    records = _lines(out / "results.jsonl")
    assert len(records) == 43
    rec = records[0]
    assert set(rec) >= {"file", "sop_instance_uid", "series_instance_uid", "frame_index", "rows", "cols",
                        "pixel_spacing_mm", "lesions", "timings_ms", "mode", "backend", "precision", "models"}
    assert set(rec["timings_ms"]) == {"decode", "preprocess", "roi", "segment", "recheck", "postprocess", "total"}
    report = evaluate(load_predictions(out), load_truth_tree([str(SAMPLE_DIR)]))
    big = next(b for b in report.buckets if b.name == "10-30")
    # the CT lesions of 10-30 mm are found (the model card's held-out figure is ~0.64)
    assert big.sensitivity >= 0.6, report
    assert report.fp_per_frame <= 0.5
    assert report.dice_mean is not None and report.dice_mean > 0.5
    # the main command's table and the report agree with results.jsonl
    assert summary.lesions == sum(len(r["lesions"]) for r in records) > 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["counts"]["lesion_sections"] == summary.lesions
    # Each lesion once: a CT lesion's sections on neighbouring slices share one number.
    numbers = {(r["series_instance_uid"], les["series_lesion"]) for r in records for les in r["lesions"]}
    assert rep["counts"]["lesions"] == summary.series_lesions == len(numbers) < summary.lesions
    with (out / "lesions.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["series_instance_uid"], int(r["lesion"])) for r in rows} == numbers
    ct_rows = [r for r in rows if r["modality"] == "CT"]
    assert any(int(r["slices"]) > 1 for r in ct_rows) and all(float(r["volume_mm3"]) > 0 for r in ct_rows)
    assert all(r["volume_mm3"] == "" and r["slices"] == "1" for r in rows if r["modality"] != "CT")
    assert {r["modality"]: r["diameter_unit"] for r in rows} == {"CT": "mm", "DX": "mm at detector"}
    for row in rows:  # the longest diameter is that of the section named
        (largest,) = [les for r in records if r["sop_instance_uid"] == row["largest_sop_instance_uid"]
                      for les in r["lesions"] if les["id"] == int(row["largest_id"])]
        assert float(row["diameter_mm"]) == pytest.approx(largest["diameter_mm"], abs=1e-3)
        assert largest["series_lesion"] == int(row["lesion"])
        assert max(les["diameter_mm"] for r in records for les in r["lesions"]
                   if r["series_instance_uid"] == row["series_instance_uid"]
                   and les["series_lesion"] == int(row["lesion"])) == largest["diameter_mm"]
    # The findings say what the diameters are in: a radiograph's are at the detector.
    units = {f["modality"]: f["diameter_unit"] for f in rep["series"]}
    assert units == {"CT": "mm", "DX": "mm at detector"}
    assert "mm at detector |" in (out / "report.md").read_text()
    from medrt.commands.batch import _table

    rows = _table(summary).splitlines()[1:]
    assert all(" mm  [ct_stream/" in r for r in rows if " CT " in r)
    # The closing line's sections are every series' (a radiograph's nodule is one): it
    # called them "on CT slices" when the radiographs' were counted in.
    from medrt.commands.batch import _summary_line

    ct_sections = sum(f["sections"] for f in rep["series"] if f["modality"] == "CT")
    assert ct_sections < summary.lesions
    line = _summary_line(summary, out)
    assert line.startswith(f"{summary.series_lesions} lesion(s) ({summary.lesions} sections: ")
    assert f"{summary.lesions} sections on CT" not in line
    assert any(" mm at detector  [radiographs/dx_" in r for r in rows)
    # each series whole (UIDs often differ only in their last digits) and its first file
    assert {r.split()[0] for r in rows} == {f["series_instance_uid"] for f in rep["series"]}
    assert {f["first_file"] for f in rep["series"]} == {"ct_stream/ct_0001.dcm", "radiographs/dx_0001.dcm",
                                                       "radiographs/dx_0002.dcm", "radiographs/dx_0003.dcm"}
    assert {"p50", "p95", "p99"} <= set(rep["timings_ms"]["segment"])
    assert (out / "report.md").read_text().startswith("# medrt batch report")
    assert (out / "latency.png").stat().st_size > 0
    assert rep["engine"]["models"] == ["roi_classifier@1.0.0", "lesion_unet@1.0.0"] or rep["engine"]["models"]


def test_eval_splits_mixed_ground_truth_by_kind(sample_run, capsys):
    """CT slices and radiographs score very differently: medrt eval on the whole sample
    folder adds a report per kind, and the parts add up to the pooled figures."""
    _, out = sample_run
    assert main(["eval", str(out), str(SAMPLE_DIR), "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    parts = doc["by_kind"]
    assert sorted(parts) == ["CT", "radiographs"]
    assert parts["CT"]["frames"] == 40 and parts["radiographs"]["frames"] == 3
    for field in ("gt_lesions", "detected", "false_positives", "frames"):
        assert parts["CT"][field] + parts["radiographs"][field] == doc[field], field
    assert main(["eval", str(out), str(CT)]) == EXIT_OK  # one kind: no split
    assert "radiographs (" not in capsys.readouterr().out


def test_eval_of_the_seg_objects_matches_eval_of_results_jsonl(sample_run, capsys):
    """The SEG carries the findings whole: scored from the run's seg.dcm files, its lesions,
    false positives and Dice are those of results.jsonl and masks.npz."""
    _, out = sample_run
    docs = []
    for extra in ([], ["--seg"]):
        assert main(["eval", str(out), str(SAMPLE_DIR), "--json", *extra]) == EXIT_OK
        docs.append(json.loads(capsys.readouterr().out))
    jsonl, seg = docs
    for field in ("gt_lesions", "detected", "false_positives", "frames", "buckets", "by_lesion"):
        assert seg[field] == jsonl[field], field
    assert seg["dice"]["n"] == jsonl["dice"]["n"] and seg["dice"]["mean"] == pytest.approx(jsonl["dice"]["mean"])
    # a series without lesions has no SEG: its frames are the ones without a prediction
    assert seg["frames_without_prediction"] == sum(
        1 for m in map(json.loads, (p.read_text() for p in out.glob("series/*/manifest.json")))
        if "seg" not in m["outputs"] for _ in m["files"])


def test_every_seg_and_sr_passes_dciodvfy(sample_run):
    dciodvfy = require_tool("dciodvfy")
    _, out = sample_run
    written = sorted(out.glob("series/*/seg.dcm")) + sorted(out.glob("series/*/sr.dcm"))
    assert any(p.name == "seg.dcm" for p in written) and sum(p.name == "sr.dcm" for p in written) == 4
    for path in written:
        proc = subprocess.run([dciodvfy, str(path)], capture_output=True, text=True, timeout=120)
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("Error")]
        assert not errors, f"{path}: {errors}"


def test_seg_geometry_matches_results_and_ground_truth(sample_run):
    import highdicom as hd

    from medrt.phantom import load_ground_truth

    _, out = sample_run
    seg_path = next(out.glob("series/*/seg.dcm"))
    seg = hd.seg.segread(seg_path)
    records = {r["sop_instance_uid"]: r for r in _lines(out / "results.jsonl")}
    truth = load_ground_truth(CT)
    # a segment per series lesion, "Lesion <n>" as results.jsonl's series_lesion numbers it
    segment_of = {int(str(d.SegmentLabel).removeprefix("Lesion ")): int(d.SegmentNumber) for d in seg.SegmentSequence}
    assert len(segment_of) == len(seg.SegmentSequence) > 1
    checked = inter = total = 0
    for uid, rec in records.items():
        if not rec["lesions"] or rec["series_instance_uid"] != seg.ReferencedSeriesSequence[0].SeriesInstanceUID:
            continue
        segments = seg.get_pixels_by_source_instance([uid], combine_segments=True,
                                                     assert_missing_frames_are_empty=True)[0]
        mask = segments > 0
        rows, cols = np.nonzero(mask)
        with np.load(out / "masks.npz") as npz:  # the label map results.jsonl's ids refer to
            labels = npz[uid]
        for les in rec["lesions"]:
            r0, c0, r1, c1 = les["bbox"]
            own = segments == segment_of[les["series_lesion"]]
            assert own[r0:r1, c0:c1].any()  # the lesion's own segment sits in the bbox results.jsonl gives
            assert np.array_equal(own, labels == les["id"])
            cr, cc = les["centroid"]
            assert r0 <= cr < r1 and c0 <= cc < c1
        assert rows.min() == min(les["bbox"][0] for les in rec["lesions"])
        assert cols.max() + 1 == max(les["bbox"][3] for les in rec["lesions"])
        assert np.array_equal(mask, labels > 0)
        gt_mask = np.asarray(truth[uid].mask) > 0
        inter += int((mask & gt_mask).sum())
        total += int(mask.sum())
        checked += 1
    assert checked >= 5
    # most SEG pixels lie on the phantom's lesions (a shifted or flipped SEG would not)
    assert inter > 0.6 * total


def test_a_series_mixing_units_labels_each_lesion_in_its_own(tmp_path, analyzer):
    """One CT slice without PixelSpacing among slices with it: its lesion is in pixels, the
    others in mm. One unit per series (the first frame's) printed pixels as mm and counted
    them in the mm size buckets."""
    src = tmp_path / "in"
    src.mkdir()
    for i, p in enumerate(sorted(CT.glob("*.dcm"))[14:18]):
        ds = pydicom.dcmread(p)
        if i == 3:
            del ds.PixelSpacing
        ds.save_as(src / p.name)
    out = tmp_path / "out"
    summary = run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer)
    rows = list(csv.DictReader((out / "lesions.csv").open()))
    units = sorted({r["diameter_unit"] for r in rows})
    assert units == ["mm", "px"]
    assert all((r["diameter_mm"] == "") == (r["diameter_unit"] == "px") for r in rows)
    rep = json.loads((out / "report.json").read_text())
    (finding,) = rep["series"]
    assert finding["diameter_unit"] == "mixed"
    assert sorted(u for _, u in finding["diameters"]) == sorted(r["diameter_unit"] for r in rows)
    in_mm = [d for d, u in finding["diameters"] if u == "mm"]
    assert sum(rep["lesions_by_diameter"].values()) == len(in_mm)  # the pixels are not bucketed as mm
    from medrt.commands.batch import _table

    line = _table(summary).splitlines()[1]
    assert " px" in line and " mm" in line


def test_a_series_without_pixel_spacing_is_measured_in_pixels_and_not_bucketed_as_mm(tmp_path, analyzer, capsys):
    """No spacing in the header: the lesions are measured in pixels (never an invented mm
    value), the findings say px, and the report's millimetre size buckets leave them out."""
    src = tmp_path / "in"
    src.mkdir()
    for p in sorted(CT.glob("*.dcm"))[14:18]:  # slices with lesions
        ds = pydicom.dcmread(p)
        del ds.PixelSpacing
        ds.save_as(src / p.name)
    out = tmp_path / "out"
    summary = run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer)
    rep = json.loads((out / "report.json").read_text())
    (finding,) = rep["series"]
    assert summary.lesions > 0 and finding["diameter_unit"] == "px" and finding["diameters_mm"]
    # results.jsonl: no pixel count in a field named mm
    lesions = [les for line in (out / "results.jsonl").read_text().splitlines() for les in json.loads(line)["lesions"]]
    assert lesions and all(les["diameter_mm"] is None and les["area_mm2"] is None for les in lesions)
    assert all(les["diameter_px"] > 0 and les["area_px"] > 0 for les in lesions)
    assert sum(rep["lesions_by_diameter"].values()) == 0
    largest = ", ".join(str(d) for d in finding["diameters_mm"][:5])
    assert f"| {largest} px |" in (out / "report.md").read_text()
    from medrt.commands.batch import _table

    # the printed findings table too, saying that no SEG could be made: a CT with a Frame of
    # Reference and no PixelSpacing cannot carry one, and errors.csv says why, naming the file
    assert " px · SEG not written (errors.csv)  [" in _table(summary).splitlines()[1]
    (row,) = list(csv.DictReader((out / "errors.csv").open()))
    assert (row["kind"], row["stage"]) == ("error", "export-seg") and row["file"].endswith(".dcm")
    assert "has a Frame of Reference UID but no PixelSpacing" in row["reason"] and src.name in row["reason"]


@pytest.mark.parametrize(("thickness", "given"), [(None, "empty"), ("NaN", "not a length in mm"),
                                                 ("0", "not a length in mm")])
def test_a_ct_whose_slice_thickness_is_empty_gets_a_seg_and_the_report_says_it_was_inferred(
        tmp_path, analyzer, thickness, given):
    """Every slice with SliceThickness empty (Type 2, legal; some anonymisers do it) and no
    SpacingBetweenSlices: the series got no SEG ("SEG not written", exit 1). Now it gets one
    whose thickness is the step between the slices (the sample's 5 mm), dciodvfy-clean, and
    the series' manifest, report.json and report.md say it was inferred and from what.
    A SliceThickness of NaN or 0 is no length either: highdicom failed on NaN ("Cannot
    encode non-finite floats"), and the series had no SEG; it is inferred the same way."""
    import highdicom as hd
    from test_io_dicom import _with_raw_value

    src = tmp_path / "in"
    src.mkdir()
    for p in sorted(CT.glob("*.dcm"))[14:18]:  # slices with lesions
        ds = pydicom.dcmread(p)
        assert float(ds.SliceThickness) == 5.0 == float(ds.SpacingBetweenSlices)
        ds.SliceThickness = None
        ds.pop("SpacingBetweenSlices", None)
        if thickness is None:
            ds.save_as(src / p.name)
        else:
            ds.decompress()
            (src / p.name).write_bytes(_with_raw_value(ds, "SliceThickness", thickness))
    out = tmp_path / "out"
    summary = run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer)
    assert summary.exit_code == EXIT_OK and summary.lesions > 0
    assert list(csv.DictReader((out / "errors.csv").open())) == []
    folder = next((out / "series").iterdir())
    seg = hd.seg.segread(folder / "seg.dcm")
    assert float(seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].SliceThickness) == 5.0
    for path in (folder / "seg.dcm", folder / "sr.dcm"):
        proc = subprocess.run([require_tool("dciodvfy"), str(path)], capture_output=True, text=True, timeout=120)
        assert "Error" not in proc.stdout + proc.stderr, path.name
    # the SR's Image Library describes the lesions' slices with the SEG's thickness (it had
    # left them without descriptors: highdicom's need a SliceThickness)
    from test_export import library_thickness

    thickness = library_thickness(folder / "sr.dcm")
    assert thickness and set(thickness.values()) == {5.0}
    said = ("seg.dcm: SEG SliceThickness 5 mm inferred from the step between neighbouring slice positions: "
            f"the source images' SliceThickness is {given}")
    assert json.loads((folder / "manifest.json").read_text())["seg_notes"] == [said]
    (finding,) = json.loads((out / "report.json").read_text())["series"]
    assert finding["seg_notes"] == [said] and finding["not_written"] == []
    assert said in (out / "report.md").read_text()


def test_interrupted_run_then_rerun_equals_one_clean_run(tmp_path, analyzer):
    src = _small_input(tmp_path)
    dx = sorted((SAMPLE_DIR / "radiographs").glob("*.dcm"))[0]
    shutil.copy(dx, src / "dx.dcm")
    clean = run_batch(BatchConfig(src, tmp_path / "clean"), analyzer=analyzer)
    assert clean.exit_code == EXIT_OK

    stop = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 3:
            stop.set()
            time.sleep(0.5)  # hold the sink thread so the run is stopped with work in flight

    first = run_batch(BatchConfig(src, tmp_path / "resumed"), analyzer=analyzer, progress=progress, stop=stop)
    assert first.interrupted and first.series_analysed < 2
    assert not list((tmp_path / "resumed").rglob("*.tmp"))
    second = run_batch(BatchConfig(src, tmp_path / "resumed"), analyzer=analyzer)
    assert second.series_resumed == first.series_analysed and second.exit_code == EXIT_OK
    assert _without_timings(_lines(tmp_path / "resumed" / "results.jsonl")) == \
        _without_timings(_lines(tmp_path / "clean" / "results.jsonl"))
    third = run_batch(BatchConfig(src, tmp_path / "resumed"), analyzer=analyzer)
    assert third.series_resumed == 2 and third.series_analysed == 0  # nothing left to do


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_process_then_rerun_equals_one_clean_run(tmp_path, analyzer, sig):
    """SIGKILL leaves what was written; SIGTERM (systemd, a scheduler, `kill`) stops the run
    as Ctrl-C does: exit 130, results and a report marked interrupted (it used to kill the
    process before either was written)."""
    src = _small_input(tmp_path, n=10 if sig == signal.SIGKILL else 24)  # SIGTERM must land mid-run
    clean = run_batch(BatchConfig(src, tmp_path / "clean"), analyzer=analyzer)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "medrt", "batch", str(src), "--out", str(tmp_path / "killed"), "--quiet",
           "--model", "lesion_unet", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((tmp_path / "killed").glob("series/*/png/*.png")):
        time.sleep(0.05)
    proc.send_signal(sig)
    said, err = proc.communicate(timeout=60)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130, err
        assert "0 of 1 series finished (0 already done)" in said, said  # not "1 series", as if all were
        assert "interrupted; run the same command again" in err and "Traceback" not in err
        assert json.loads((tmp_path / "killed" / "report.json").read_text())["interrupted"] is True
        assert (tmp_path / "killed" / "results.jsonl").is_file()
    rerun = run_batch(BatchConfig(src, tmp_path / "killed"), analyzer=analyzer)
    assert rerun.exit_code == EXIT_OK
    assert _without_timings(_lines(tmp_path / "killed" / "results.jsonl")) == \
        _without_timings(_lines(tmp_path / "clean" / "results.jsonl"))
    assert clean.lesions == rerun.lesions


def test_sigterm_while_the_report_is_written_waits_for_it(tmp_path, monkeypatch, capsys):
    """systemd stops the unit just as the last series finishes: the SIGTERM lands while
    the results and report are written. It used to end with "medrt: interrupted" and no
    report; now the writing finishes and the run exits 130. The signal is real (raised in
    this, the main, thread, through medrt's own SIGTERM handler) at the moment the report
    starts; the wrapper only picks that moment. report.json said exit_code 0 all the same:
    it is written once more, saying 130 and the signal."""
    from medrt.batch import report

    src = _small_input(tmp_path, n=3)
    out = tmp_path / "out"
    write_report = report.write_report
    raised = []

    def signalled_midway(*args, **kwargs):
        raised.append(signal.getsignal(signal.SIGTERM))
        signal.raise_signal(signal.SIGTERM)  # its handler has run when this returns
        signal.raise_signal(signal.SIGINT)  # and a Ctrl-C on top, from someone who thinks it hung
        return write_report(*args, **kwargs)

    monkeypatch.setattr(report, "write_report", signalled_midway)
    before = signal.getsignal(signal.SIGTERM)
    rc = main(["batch", str(src), "--out", str(out), "--quiet", "--model", "lesion_unet", "--workers", "1"])
    err = capsys.readouterr().err
    assert raised, "the report was never written"
    assert rc == 130, err
    assert "medrt: interrupted" not in err
    assert "medrt batch: SIGTERM while the results and report were written; they were finished first" in err
    written = json.loads((out / "report.json").read_text())
    assert written["interrupted"] is False and written["counts"]["series_analysed"] == 1
    assert written["counts"]["frames"] == 3 and (out / "report.md").is_file()
    # what a script reading report.json checks agrees with the process (it said 0, exit 130)
    assert (written["exit_code"], written["stopped_while_writing"]) == (130, "SIGTERM")
    assert "**SIGTERM** while this report was written: it is complete, and the run exited 130" in \
        (out / "report.md").read_text()
    assert len(_lines(out / "results.jsonl")) == 3
    assert signal.getsignal(signal.SIGTERM) == before, "the handlers must come back after the run"


def test_deferred_interrupts_note_signals_and_put_the_handlers_back():
    from medrt.batch.interrupts import DeferredInterrupts

    # Python's own Ctrl-C handler, whatever started the tests (a shell's background job,
    # as CI's, inherits SIGINT ignored, and Python then installs none)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        with DeferredInterrupts() as held:
            assert held.received is None
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
        assert held.received == "SIGTERM"  # the first one
        assert {sig: signal.getsignal(sig) for sig in before} == before
        with pytest.raises(KeyboardInterrupt):  # acted on again once out of it
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, inherited)

    seen = []  # in another thread it leaves the handlers alone (signal.signal would raise there)
    thread = threading.Thread(target=lambda: seen.append(DeferredInterrupts().__enter__()._previous))
    thread.start()
    thread.join()
    assert seen == [{}]


def test_an_ignored_signal_stays_ignored_while_the_report_is_written(tmp_path, monkeypatch, capsys):
    """A batch started in the background of a script inherits SIGINT ignored: a Ctrl-C at
    the script's terminal does not stop it. One that came while the report was written was
    noted all the same, and the finished run exited 130 ("interrupted")."""
    from medrt.batch import report
    from medrt.batch.interrupts import DeferredInterrupts

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with DeferredInterrupts() as held:
            signal.raise_signal(signal.SIGINT)
        assert held.received is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN

        src = _small_input(tmp_path, n=2)
        write_report = report.write_report

        def ctrl_c_midway(*args, **kwargs):
            signal.raise_signal(signal.SIGINT)
            return write_report(*args, **kwargs)

        monkeypatch.setattr(report, "write_report", ctrl_c_midway)
        rc = main(["batch", str(src), "--out", str(tmp_path / "out"), "--quiet", "--model", "lesion_unet",
                   "--workers", "1"])
        assert rc == 0, capsys.readouterr().err
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_bad_files_are_listed_and_the_run_completes(tmp_path, analyzer, capsys):
    src = _small_input(tmp_path, n=3)
    other = sorted(CT.glob("*.dcm"))[0]  # a slice not in the input, so it is not a duplicate
    (src / "truncated.dcm").write_bytes(other.read_bytes()[:4000])
    (src / "random.dcm").write_bytes(np.random.default_rng(0).bytes(5000))
    shutil.copy(pydicom_test_dir() / "test-SR.dcm", src / "report_sr.dcm")
    shutil.copy(pydicom_test_dir() / "MR_small.dcm", src / "mr.dcm")  # no model here is for MR
    (src / "notes.txt").write_text("scanner notes")
    out = tmp_path / "out"
    rc = main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1"])
    assert rc == EXIT_ERRORS
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert rows["truncated.dcm"]["kind"] == "error" and rows["truncated.dcm"]["stage"] == "decode"
    assert "truncated" in rows["truncated.dcm"]["reason"] or "pixel" in rows["truncated.dcm"]["reason"].lower()
    assert rows["random.dcm"]["kind"] == "skipped" and "not a DICOM" in rows["random.dcm"]["reason"]
    assert rows["report_sr.dcm"]["kind"] == "skipped" and "not an image" in rows["report_sr.dcm"]["reason"]
    assert rows["notes.txt"]["kind"] == "skipped"
    # passed over before decoding, with the reason: not broken, just not for these models
    assert (rows["mr.dcm"]["kind"], rows["mr.dcm"]["stage"]) == ("skipped", "plan") and rows["mr.dcm"]["sop_instance_uid"]
    assert rows["mr.dcm"]["reason"].startswith("no model for this image: MR frame, but lesion_unet_lite@")
    assert "for CR, CT, DX only" in rows["mr.dcm"]["reason"]
    assert len(_lines(out / "results.jsonl")) == 3  # the three good slices
    assert "errors.csv" in capsys.readouterr().out


def test_a_series_none_of_whose_images_could_be_read_is_not_shown_as_negative(tmp_path, analyzer, capsys):
    """A series whose every image failed to decode was not analysed: the findings table,
    report.md and report.json say so, never "0 lesions" as for a series found clean; a
    series with some images not analysed says how many beside its findings."""
    src = _small_input(tmp_path, n=3)
    lost = src / "lost"
    lost.mkdir()
    for p in sorted(RADIOGRAPHS.glob("*.dcm")):  # each radiograph is a series of its own
        (lost / p.name).write_bytes(p.read_bytes()[:6000])  # headers whole, pixels cut off
    other = sorted(CT.glob("*.dcm"))[0]  # a slice of the CT series not in the input
    (src / "ct" / "truncated.dcm").write_bytes(other.read_bytes()[:4000])
    out = tmp_path / "out"
    rc = main(["batch", str(src), "--out", str(out), "--workers", "1"])
    assert rc == EXIT_ERRORS
    report = json.loads((out / "report.json").read_text())
    by_modality = {}
    for f in report["series"]:
        by_modality.setdefault(f["modality"], []).append(f)
    (ct,) = by_modality["CT"]
    assert (ct["frames"], ct["failed"], ct["not_written"]) == (3, 1, []) and ct["lesions"] > 0
    dx = by_modality["DX"]
    assert len(dx) == 3 and all((f["frames"], f["failed"], f["lesions"]) == (0, 1, 0) for f in dx)
    table = capsys.readouterr().out
    rows = {line.split()[0]: line for line in table.splitlines() if line[:1].isdigit()}
    for f in dx:
        row = rows[f["series_instance_uid"]]
        assert row.split()[2:4] == ["0", "-"] and "not analysed: 1 image(s) failed (errors.csv)" in row, row
    assert "1 image(s) not analysed (errors.csv)" in rows[ct["series_instance_uid"]]
    md = (out / "report.md").read_text()
    assert md.count("| 0 | - | - | - | not analysed: 1 image(s) failed (errors.csv) |") == 3
    assert f"| {ct['lesions']} | {ct['sections']} |" in md and "| 1 image(s) not analysed (errors.csv) |" in md


def test_a_copied_image_and_a_second_image_at_one_position_are_told_apart(tmp_path, analyzer):
    """Two files of one instance (a copy) and two instances at one slice position (a
    re-acquisition) are both passed over once, each with its own reason and the file kept."""
    src = _small_input(tmp_path, n=3)
    first, second = sorted((src / "ct").glob("*.dcm"))[:2]
    shutil.copy(first, src / "ct" / "zz_copy.dcm")  # met later, so the copy is the one kept
    ds = pydicom.dcmread(second)
    ds.SOPInstanceUID = pydicom.uid.generate_uid(entropy_srcs=["medrt-test", ds.SOPInstanceUID])
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.AcquisitionNumber = int(ds.get("AcquisitionNumber") or 0) + 1
    ds.save_as(src / "ct" / "reacquired.dcm")
    out = tmp_path / "out"
    run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer)
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert rows[f"ct/{first.name}"]["reason"] == (
        "another copy of an image of the series (same SOPInstanceUID); ct/zz_copy.dcm was kept")
    assert rows[f"ct/{second.name}"]["reason"].startswith(
        "same slice position as ct/reacquired.dcm, which was kept (the higher AcquisitionNumber")
    assert {r["kind"] for r in rows.values()} == {"skipped"} and len(rows) == 2
    assert len(_lines(out / "results.jsonl")) == 3


def test_a_for_processing_radiograph_is_passed_over_with_the_reason(tmp_path):
    """A modality that sends a CAD node both images: the For Presentation one is analysed,
    the For Processing one (raw detector data) is passed over before decoding, named."""
    from pydicom.uid import DigitalXRayImageStorageForProcessing

    src = _small_input(tmp_path, n=2)
    ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForProcessing
    ds.PresentationIntentType = "FOR PROCESSING"
    ds.save_as(src / "dx_raw.dcm")
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == EXIT_OK
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    row = rows["dx_raw.dcm"]
    assert (row["kind"], row["stage"], row["sop_instance_uid"]) == ("skipped", "plan", ds.SOPInstanceUID)
    assert "DX FOR PROCESSING frame (a For Processing image" in row["reason"]
    assert len(_lines(out / "results.jsonl")) == 2  # the two CT slices


def test_ct_localizers_are_passed_over_not_read_as_slices(tmp_path):
    """Every CT study holds a localizer (scout, topogram): Modality CT, CT Image Storage,
    Image Type ORIGINAL\\PRIMARY\\LOCALIZER. A localizer series is passed over before
    decoding; a localizer filed inside an axial series is refused on its own, and the
    slices around it are analysed."""
    from pydicom.uid import generate_uid

    src = _small_input(tmp_path, n=3)
    slices = sorted((src / "ct").glob("*.dcm"))

    def localizer(name: str, series_uid: str) -> pydicom.Dataset:
        ds = pydicom.dcmread(slices[0])
        ds.ImageType = ["ORIGINAL", "PRIMARY", "LOCALIZER"]
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.SeriesInstanceUID = series_uid
        ds.ImagePositionPatient = [float(v) + 0.5 for v in ds.ImagePositionPatient]  # not a duplicate slice
        ds.save_as(src / name)
        return ds

    scout = localizer("scout.dcm", generate_uid())
    inside = localizer("ct/zz_scout.dcm", pydicom.dcmread(slices[0]).SeriesInstanceUID)
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == EXIT_OK
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert (rows["scout.dcm"]["kind"], rows["scout.dcm"]["stage"]) == ("skipped", "plan")
    assert rows["scout.dcm"]["sop_instance_uid"] == scout.SOPInstanceUID
    assert "CT LOCALIZER frame (a localizer, or scout" in rows["scout.dcm"]["reason"]
    assert rows["ct/zz_scout.dcm"]["kind"] == "skipped" and rows["ct/zz_scout.dcm"]["stage"] != "plan"
    assert "CT LOCALIZER frame" in rows["ct/zz_scout.dcm"]["reason"]
    analysed = {r["sop_instance_uid"] for r in _lines(out / "results.jsonl")}
    assert len(analysed) == 3 and inside.SOPInstanceUID not in analysed


def test_a_knee_and_a_lateral_chest_radiograph_are_passed_over_with_the_reason(tmp_path):
    """A radiography room's whole feed: the chest model takes PA/AP chest radiographs only."""
    from pydicom.uid import generate_uid

    src = _small_input(tmp_path, n=2)
    for name, body_part, view in (("knee.dcm", "KNEE", "AP"), ("lateral.dcm", "CHEST", "LL")):
        ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
        ds.BodyPartExamined, ds.ViewPosition = body_part, view
        ds.SeriesInstanceUID = generate_uid()
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.save_as(src / name)
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == EXIT_OK
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert (rows["knee.dcm"]["kind"], rows["knee.dcm"]["stage"]) == ("skipped", "plan")
    assert "DX frame of BodyPartExamined KNEE, but lesion_unet_dx@" in rows["knee.dcm"]["reason"]
    assert (rows["lateral.dcm"]["kind"], rows["lateral.dcm"]["stage"]) == ("skipped", "plan")
    assert "DX frame of ViewPosition LL, but lesion_unet_dx@" in rows["lateral.dcm"]["reason"]
    assert len(_lines(out / "results.jsonl")) == 2  # the two CT slices


def test_a_site_word_for_the_chest_is_read_as_chest_and_strict_routing_refuses_a_blank_header(tmp_path):
    """``--body-part-alias TORAX=CHEST``: a room that writes its own word gets the chest
    model; ``--strict-routing``: a radiograph whose header names no body part is passed
    over with the reason (the CT model lists none, so CT slices are taken as before)."""
    from pydicom.uid import generate_uid

    src = _small_input(tmp_path, n=2)
    for name, body_part in (("torax.dcm", "Torax"), ("blank.dcm", None)):
        ds = pydicom.dcmread(SAMPLE_DIR / "radiographs" / "dx_0001.dcm")
        if body_part is None:
            del ds.BodyPartExamined
        else:
            ds.BodyPartExamined = body_part
        ds.SeriesInstanceUID = generate_uid()
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.save_as(src / name)
    torax = pydicom.dcmread(src / "torax.dcm", stop_before_pixels=True).SOPInstanceUID
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1", "--png", "none",
                 "--body-part-alias", "torax=chest", "--strict-routing"]) == EXIT_OK
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    assert set(rows) == {"blank.dcm"} and rows["blank.dcm"]["stage"] == "plan"
    assert ("DX frame whose header names no BodyPartExamined, and with --strict-routing lesion_unet_dx@"
            in rows["blank.dcm"]["reason"])
    analysed = {r["sop_instance_uid"] for r in _lines(out / "results.jsonl")}
    assert len(analysed) == 3 and torax in analysed
    with pytest.raises(SystemExit) as bad:
        main(["batch", str(src), "--out", str(tmp_path / "x"), "--body-part-alias", "TORAX"])
    assert bad.value.code == 2


def test_a_coronal_reformat_series_is_passed_over_before_decoding(tmp_path):
    from pydicom.uid import generate_uid

    src = _small_input(tmp_path, n=2)
    series = generate_uid()
    for i, path in enumerate(sorted((src / "ct").glob("*.dcm"))):
        ds = pydicom.dcmread(path)
        ds.ImageOrientationPatient = [1, 0, 0, 0, 0, -1]
        x, y, z = (float(v) for v in ds.ImagePositionPatient)
        ds.ImagePositionPatient = [x, y + 2.0 * i, z]  # one step apart along the coronal normal
        ds.SeriesInstanceUID, ds.SeriesDescription = series, "COR 2mm"
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.save_as(src / f"cor_{i}.dcm")
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--quiet", "--workers", "1", "--png", "none"]) == EXIT_OK
    rows = {r["file"]: r for r in csv.DictReader((out / "errors.csv").open())}
    for name in ("cor_0.dcm", "cor_1.dcm"):
        assert (rows[name]["kind"], rows[name]["stage"]) == ("skipped", "plan")
        assert "CT frame in the CORONAL plane" in rows[name]["reason"]
    assert len(_lines(out / "results.jsonl")) == 2  # the axial slices


def test_quiet_prints_errors_and_the_summary_but_no_warnings(tmp_path):
    """--quiet is for cron jobs: the per-file warnings (here, one slice given twice) stay
    out of the console, where without it they show; errors.csv keeps every file passed over."""
    src = _small_input(tmp_path, n=2)
    first = sorted((src / "ct").glob("*.dcm"))[0]
    shutil.copy(first, src / "copy_of_a_slice.dcm")
    (src / "random.dcm").write_bytes(np.random.default_rng(1).bytes(3000))
    # pydicom warns through its own logger, whose level it sets itself: --quiet must hold it too
    (src / "ct" / "cut_short.dcm").write_bytes(sorted(CT.glob("*.dcm"))[0].read_bytes()[:4000])
    runs = {}
    for flags in ((), ("--quiet",)):
        runs[flags] = subprocess.run(
            [sys.executable, "-m", "medrt", "batch", str(src), "--out", str(tmp_path / f"out{len(flags)}"),
             "--workers", "1", *flags], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert runs[flags].returncode in (EXIT_OK, EXIT_ERRORS), runs[flags].stderr
        assert "errors.csv" in runs[flags].stdout  # the summary line
    assert "given twice" in runs[()].stderr and "WARNING" in runs[()].stderr
    assert "End of file reached" in runs[()].stderr
    assert "WARNING" not in runs[("--quiet",)].stderr and "given twice" not in runs[("--quiet",)].stderr
    rows = list(csv.DictReader((tmp_path / "out1" / "errors.csv").open()))
    files = {Path(r["file"]).name for r in rows}
    assert "random.dcm" in files and len(files & {first.name, "copy_of_a_slice.dcm"}) == 1  # the copy passed over


def test_seg_options_from_the_command_line(tmp_path, capsys):
    """--seg-compression jpeg2000 --keep-empty-frames: a JPEG 2000 Lossless SEG with every
    slice's frame for every lesion, which medrt eval --seg scores as results.jsonl."""
    src = _small_input(tmp_path, n=4)
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--workers", "1", "--threads", "1", "--png", "none",
                 "--seg-compression", "jpeg2000", "--keep-empty-frames", "--quiet"]) == EXIT_OK
    (seg_path,) = out.glob("series/*/seg.dcm")
    seg = pydicom.dcmread(seg_path)
    assert seg.file_meta.TransferSyntaxUID == pydicom.uid.JPEG2000Lossless
    assert int(seg.NumberOfFrames) == 4 * len(seg.SegmentSequence) > 4  # every slice, each lesion
    capsys.readouterr()
    docs = []
    for extra in ([], ["--seg"]):
        assert main(["eval", str(out), str(CT), "--json", *extra]) == EXIT_OK
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["detected"] == docs[1]["detected"] > 0
    assert docs[0]["false_positives"] == docs[1]["false_positives"]
    assert docs[0]["dice"]["mean"] == pytest.approx(docs[1]["dice"]["mean"])


def test_a_folder_no_model_is_for_fails_and_says_why(tmp_path):
    """Only images of a modality none of the models lists (MR, with the CT and radiograph
    models): nothing to analyse, so the run fails (exit 2), and errors.csv says why."""
    (tmp_path / "in").mkdir()
    shutil.copy(pydicom_test_dir() / "MR_small.dcm", tmp_path / "in" / "mr.dcm")
    summary = run_batch(BatchConfig(tmp_path / "in", tmp_path / "out"))
    assert summary.exit_code == EXIT_FAILED and summary.frames == 0 and summary.skipped == 1
    (row,) = csv.DictReader((tmp_path / "out" / "errors.csv").open())
    assert row["file"] == "mr.dcm" and "MR frame" in row["reason"]


def test_a_folder_of_unreadable_files_says_so_not_that_no_model_is_for_them(tmp_path, capsys):
    """CT slices without a Series Instance UID are errors (named in errors.csv), and the
    closing line says files could not be read, not that no model is for them."""
    src = tmp_path / "in"
    src.mkdir()
    ds = pydicom.dcmread(sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[0])
    del ds.SeriesInstanceUID
    ds.save_as(src / "a.dcm")
    assert main(["batch", str(src), "--out", str(tmp_path / "out")]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "1 file(s) could not be read" in err and "errors.csv" in err and "models are for" not in err
    (row,) = csv.DictReader((tmp_path / "out" / "errors.csv").open())
    assert row["file"] == "a.dcm" and row["reason"].endswith(
        "incomplete header: no SeriesInstanceUID, so it cannot be grouped into a series")  # not "corrupt DICOM"

    # A series whose only image cannot be decoded: nothing was analysed, so the run failed
    # (exit 2, as --help says), not "completed with errors" (1), as it said before.
    (src / "a.dcm").unlink()
    (src / "b.dcm").write_bytes((SAMPLE_DIR / "ct_stream" / "ct_0003.dcm").read_bytes()[:5000])
    assert main(["batch", str(src), "--out", str(tmp_path / "out2"), "--quiet"]) == EXIT_FAILED


def test_empty_or_missing_input_fails(tmp_path, analyzer):
    (tmp_path / "empty").mkdir()
    assert run_batch(BatchConfig(tmp_path / "empty", tmp_path / "out"), analyzer=analyzer).exit_code == EXIT_FAILED
    assert main(["batch", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2


def test_output_folder_inside_input_is_not_rescanned(tmp_path, analyzer):
    src = _small_input(tmp_path, n=2)
    first = run_batch(BatchConfig(src, src / "results"), analyzer=analyzer)
    again = run_batch(BatchConfig(src, src / "results"), analyzer=analyzer)
    assert first.frames == again.frames == 2 and again.skipped == first.skipped == 0


def test_batch_in_worker_processes_equals_threads(tmp_path, analyzer):
    """--processes: the same findings and masks as the threaded run (timings apart)."""
    src = _small_input(tmp_path, n=4)
    dx = sorted((SAMPLE_DIR / "radiographs").glob("*.dcm"))[0]
    shutil.copy(dx, src / "dx.dcm")
    threads = run_batch(BatchConfig(src, tmp_path / "threads"), analyzer=analyzer)
    procs = run_batch(BatchConfig(src, tmp_path / "procs", processes=2), analyzer=analyzer)
    assert threads.exit_code == procs.exit_code == EXIT_OK and procs.frames == threads.frames == 5
    assert _without_timings(_lines(tmp_path / "procs" / "results.jsonl")) == \
        _without_timings(_lines(tmp_path / "threads" / "results.jsonl"))
    for a in sorted((tmp_path / "threads").rglob("masks.npz")):
        b = tmp_path / "procs" / a.relative_to(tmp_path / "threads")
        with np.load(a) as x, np.load(b) as y:
            assert sorted(x.files) == sorted(y.files)
            assert all(np.array_equal(x[k], y[k]) for k in x.files)


def test_the_product_scores_what_the_model_cards_measured(tmp_path):
    """The model cards' figures come from ``models/evaluate.py``, which calls the analysis
    functions on phantoms in memory. The same CT series as DICOM files (the committed
    sample), run by ``medrt batch`` with its default models and scored by ``medrt eval``,
    must score the same: the same lesions found, the same false positives, the same Dice."""
    from medrt.commands.eval import load_truth_tree
    from medrt.engine.registry import shipped_models_dir
    from medrt.evaluation import evaluate, load_predictions
    from medrt.models.evaluate import collect
    from medrt.phantom.folders import SAMPLE_CT

    summary = run_batch(BatchConfig(CT, tmp_path / "out", workers=2))  # the default analyzer
    assert summary.exit_code == EXIT_OK and summary.frames == 40
    product = evaluate(load_predictions(tmp_path / "out"), load_truth_tree([str(CT)]))
    # collect() draws CT series seed + 100 + s, as the held-out and validation sets
    _, ct, _ = collect(shipped_models_dir(), 0, 1, unets=("lesion_unet_lite",), seed=SAMPLE_CT["seed"] - 100)
    cards = evaluate(ct.preds["lesion_unet_lite+recheck"], ct.truth)
    assert product.frames == cards.frames == 40 and product.gt_lesions == cards.gt_lesions > 5
    assert [(b.name, b.gt, b.detected) for b in product.buckets] == [(b.name, b.gt, b.detected) for b in cards.buckets]
    assert product.detected > 0 and product.false_positives == cards.false_positives
    assert product.dice_mean == pytest.approx(cards.dice_mean, abs=1e-6)


def test_a_series_waiting_for_its_seg_holds_no_pixels_and_no_empty_label_maps() -> None:
    """What a series keeps of each frame until its SEG is written (strip_pixels): no pixels,
    and for a frame without lesions no label map (zero-stride views of the same shape); the
    SEG built from what it kept is the SEG of the full results."""
    from medrt.batch.outputs import strip_pixels
    from medrt.bench.outputs import truth_result
    from medrt.export import build_seg
    from medrt.io.dicom import read_frames
    from medrt.phantom import load_ground_truth

    truth = {t.file.name: t for t in load_ground_truth(CT).values()}
    names = sorted(truth)[10:22]
    full = [truth_result(read_frames(CT / n)[0], truth[n].mask) for n in names]
    assert any(r.lesions for r in full) and not all(r.lesions for r in full)
    kept = [strip_pixels(r) for r in full]
    for r, k in zip(full, kept, strict=True):
        assert k.frame.pixels.shape == r.frame.pixels.shape and k.frame.pixels.strides == (0, 0)
        assert k.labels.shape == r.labels.shape and k.labels.dtype == r.labels.dtype
        assert (k.labels.strides == (0, 0)) == (not r.lesions)
        assert np.array_equal(k.labels, r.labels)
    a, b = build_seg(full), build_seg(kept)
    assert a.PixelData == b.PixelData and a.NumberOfFrames == b.NumberOfFrames


def test_file_names_that_are_not_utf8_are_analysed_and_named(tmp_path, analyzer, capsys):
    """A disc from another hospital may name files in Latin-1: such names are not UTF-8,
    and the run crashed on them (hashing the series, writing errors.csv). Now they are
    analysed, and named with \\x escapes where a file must be UTF-8 text."""
    src = _small_input(tmp_path, n=2)
    first = sorted((src / "ct").iterdir())[0]
    os.rename(first, os.fsdecode(bytes(src / "ct") + b"/0r\xf6ntgen.dcm"))
    (src / os.fsdecode(b"bad\xffname.dcm")).write_bytes(b"\xff\xfe not dicom")
    out = tmp_path / "out"
    assert main(["batch", str(src), "--out", str(out), "--workers", "1"]) == EXIT_OK
    assert {r["file"] for r in _lines(out / "results.jsonl")} >= {os.fsdecode(b"ct/0r\xf6ntgen.dcm")}
    errors = (out / "errors.csv").read_text(encoding="utf-8")
    assert "bad\\udcffname.dcm,skipped,scan,not a DICOM file" in errors
    assert "[ct/0r\\xf6ntgen.dcm]" in capsys.readouterr().out  # the first file, as the terminal can show it


def test_an_out_that_cannot_be_written_is_named_before_the_models_load(tmp_path, capsys, monkeypatch):
    import medrt.analyzer

    monkeypatch.setattr(medrt.analyzer, "load_analyzer", lambda *a, **k: pytest.fail("models loaded"))
    taken = tmp_path / "a-file"
    taken.write_text("")
    for out, reason in ((taken, "File exists"), (taken / "below", "Not a directory"),
                        (Path("/proc/medrt-out"), "No such file or directory")):
        assert main(["batch", str(CT), "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == f"medrt batch: cannot write to {out}: {reason}"
    assert main(["batch", str(CT), "--out", str(tmp_path / "o"), "--ray", ""]) == 2  # an unset $RAY_ADDRESS
    assert "--ray needs an address" in capsys.readouterr().err


def test_a_series_whose_outputs_cannot_be_written_is_not_finished(tmp_path, analyzer):
    """A full disk (here: the series' png folder gone, a file in its place, mid-series)
    made the run write the manifest anyway, noting 'fewer frames decoded', so the series
    read as finished with its lesions lost, and a rerun skipped it. Now it is not finished:
    errors.csv says why, and the next run analyses it again."""
    src = _small_input(tmp_path, n=4)
    out = tmp_path / "out"

    def progress(done, total):
        if done == 2:  # after two frames are written, the series' folder stops taking files
            (png,) = out.glob("series/*/png")
            shutil.rmtree(png)
            png.write_text("not a folder")

    first = run_batch(BatchConfig(src, out, workers=1, outputs=OutputOptions(png="all")), analyzer=analyzer,
                      progress=progress)
    assert first.exit_code == EXIT_FAILED and first.series_analysed == 0 and list(first.unwritten)
    assert not list(out.glob("series/*/manifest.json"))
    (row,) = csv.DictReader((out / "errors.csv").open())
    assert (row["kind"], row["stage"]) == ("error", "write") and "the next run analyses it again" in row["reason"]
    assert "NotADirectoryError" in row["reason"] or "FileExistsError" in row["reason"]
    second = run_batch(BatchConfig(src, out, workers=1, outputs=OutputOptions(png="all")), analyzer=analyzer)
    assert second.exit_code == EXIT_OK and second.series_analysed == 1 and second.frames == 4


def test_a_series_analysed_again_names_its_earlier_sr_as_predecessor(tmp_path, analyzer):
    """A series that grows after its results went out (a sender that stopped half-way, then
    sent the rest) gets a new SR; a PACS holds both. The new one lists the earlier one in
    its Predecessor Documents Sequence, so a viewer can tell which is current."""
    src = _small_input(tmp_path, n=2)
    out = tmp_path / "out"
    assert run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer).exit_code == EXIT_OK
    (first_sr,) = out.glob("series/*/sr.dcm")
    first = pydicom.dcmread(first_sr)
    assert "PredecessorDocumentsSequence" not in first
    shutil.copy(sorted(CT.glob("*.dcm"))[16], src / "ct")  # the third slice comes later
    second = run_batch(BatchConfig(src, out, workers=1), analyzer=analyzer)
    assert second.series_analysed == 1 and second.frames == 3
    (new_sr,) = out.glob("series/*/sr.dcm")
    new = pydicom.dcmread(new_sr)
    (study,) = new.PredecessorDocumentsSequence
    (series,) = study.ReferencedSeriesSequence
    (instance,) = series.ReferencedSOPSequence
    assert (study.StudyInstanceUID, series.SeriesInstanceUID, instance.ReferencedSOPInstanceUID) == (
        first.StudyInstanceUID, first.SeriesInstanceUID, first.SOPInstanceUID)
    assert new.SOPInstanceUID != first.SOPInstanceUID
    run = subprocess.run([require_tool("dciodvfy"), str(new_sr)], capture_output=True, text=True, timeout=120)
    assert not [ln for ln in (run.stdout + run.stderr).splitlines() if ln.startswith("Error")], run.stderr


def test_an_image_without_a_sop_instance_uid_is_named_and_its_series_results_are_written(tmp_path, analyzer):
    """A slice without SOPInstanceUID was grouped and analysed with its series, and then the
    series' SEG and SR (which refer to each image by that UID) failed for every file of it:
    one bad file cost the good ones their results."""
    src = tmp_path / "in"
    src.mkdir()
    paths = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[:3]
    for path in paths[:2]:
        shutil.copy(path, src / path.name)
    ds = pydicom.dcmread(paths[2])
    del ds.SOPInstanceUID
    ds.save_as(src / "no_uid.dcm")
    result = run_batch(BatchConfig(src, tmp_path / "out"), analyzer=analyzer)
    assert result.exit_code == EXIT_ERRORS
    rows = list(csv.DictReader((tmp_path / "out" / "errors.csv").open()))
    assert [(r["file"], r["kind"], r["stage"]) for r in rows] == [("no_uid.dcm", "error", "scan")], rows
    assert rows[0]["reason"] == "incomplete header: no SOPInstanceUID, so results cannot refer to it"


def test_of_two_copies_of_an_image_the_one_that_decodes_is_analysed(tmp_path, analyzer):
    """A re-sent image, whole in one file and cut short in another met later: the cut copy
    was kept (the later one is preferred) and failed, the whole one passed over as a
    duplicate, and the image was never analysed."""
    src = tmp_path / "in"
    src.mkdir()
    paths = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[:2]
    for path in paths:
        shutil.copy(path, src / path.name)
    data = paths[0].read_bytes()
    (src / "z_resent.dcm").write_bytes(data[: len(data) - 1000])  # the same instance, cut short
    result = run_batch(BatchConfig(src, tmp_path / "out"), analyzer=analyzer)
    assert result.exit_code == EXIT_OK
    (row,) = csv.DictReader((tmp_path / "out" / "errors.csv").open())
    assert row["file"] == "z_resent.dcm" and row["kind"] == "skipped"
    assert row["reason"].endswith(f"{paths[0].name} was kept")


class _CountedFrames(dict):
    """A series plan's ``{file: frames}`` that counts the walks over all of its files."""

    walks = 0

    def _walk(self):
        type(self).walks += 1

    def items(self):
        self._walk()
        return super().items()

    def values(self):
        self._walk()
        return super().values()

    def keys(self):
        self._walk()
        return super().keys()

    def __iter__(self):
        self._walk()
        return super().__iter__()


def test_a_series_knows_it_is_complete_without_walking_all_its_files_per_frame(tmp_path) -> None:
    """Each result asks whether its series is complete. That walked every file of the
    series each time: O(n²), 2 million look-ups for a 2,000-slice CT. Now the files still
    short of their frames are counted as results come: the plan's files are walked once,
    and the series is complete exactly when its last frame (or failure) is in."""
    import dataclasses

    from medrt.batch.outputs import SeriesOutput
    from medrt.batch.plan import scan
    from medrt.bench.outputs import truth_result
    from medrt.io.dicom import read_frames

    src = _small_input(tmp_path, 8)
    (plan,) = scan(src).series
    frames = _CountedFrames(plan.frames)
    plan = dataclasses.replace(plan, frames=frames)
    so = SeriesOutput(plan, tmp_path / "out", "key", OutputOptions(png="none"), src)
    so.start()
    walked = _CountedFrames.walks
    *analysed, failed = plan.paths
    for p in analysed:
        assert not so.complete
        frame = read_frames(p)[0]
        so.add(truth_result(frame, np.zeros(frame.shape, np.uint8)), str(p))
    assert not so.complete
    so.fail(str(failed), "decode", "a damaged file")
    assert so.complete
    assert _CountedFrames.walks - walked == 0, "the series' files were walked again to tell it complete"


def test_a_series_lays_out_its_segs_once_for_the_seg_and_the_sr(tmp_path, monkeypatch):
    """Which images a SEG can hold, in which groups, with which inferred thickness, walks
    every header of the series: it was worked out three times per series (seg_left_out,
    split_for_seg, and the SR's seg_left_out), 0.1 s each for 1,200 slices; now once, and
    the SEG and SR are made all the same. The test counts the layouts of a real series."""
    import medrt.export.seg as seg_module
    from medrt.bench.outputs import _finish, _results, phantom_series

    layouts = []
    real = seg_module._plan
    monkeypatch.setattr(seg_module, "_plan", lambda results: layouts.append(len(results)) or real(results))
    sp, results = _results(phantom_series(12, cache=tmp_path / "cache"))
    manifest = _finish(sp, results, tmp_path / "series")[0]
    assert manifest["outputs"]["seg"] == ["seg.dcm"] and manifest["outputs"]["sr"] == "sr.dcm"
    assert layouts == [12]
