"""The real analysis stages in the pipeline, and ``medrt stream``, on the sample CT stream."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import SAMPLE_DIR, two_pass_series
from medrt.analyzer import load_analyzer
from medrt.cli import main
from medrt.io.sources import FileReplay
from medrt.pipeline.graph import Pipeline
from medrt.pipeline.stages import analysis_stages

CT = SAMPLE_DIR / "ct_stream"


@pytest.fixture(scope="module")
def analyzer():
    return load_analyzer(seg_model="lesion_unet_lite", threads=1)


def _lesions_by_frame(results):  # type: ignore[no-untyped-def]
    return {r.frame.sop_instance_uid: [les.bbox for les in r.lesions] for r in results}


class Collect:
    def __init__(self):
        self.results, self.errors = [], []

    def on_result(self, result, env):
        self.results.append(result)

    def on_error(self, error, env):
        self.errors.append(error)


def test_pipelined_results_equal_the_serial_path_in_order(analyzer):
    """Each slice reaches the model with its neighbours in the series (the 2.5-D lite
    UNet), as the serial path gives them."""
    from medrt.analysis.slices import series_neighbours
    from medrt.io.dicom import read_frames

    paths = sorted(CT.glob("*.dcm"))[:16]
    sink = Collect()
    stages = analysis_stages(analyzer, infer_workers=2, order=paths)
    pipe = Pipeline(FileReplay(paths, fps=0), stages, [sink], telemetry=True)
    assert pipe.run(timeout=300)
    frames = [read_frames(p)[0] for p in paths]
    serial = [analyzer.analyze(f, neighbours=nb) for f, nb in zip(frames, series_neighbours(frames), strict=True)]
    assert [r.frame.source.path for r in sink.results] == paths
    for got, want in zip(sink.results, serial, strict=True):
        assert [les.bbox for les in got.lesions] == [les.bbox for les in want.lesions]
        assert got.crops == want.crops
    summary = pipe.telemetry.summary()
    assert summary["frames"] == 16 and summary["errors"]["decode"] == 0
    assert summary["stages_ms"]["segment"]["n"] == 16 - pipe.telemetry.warmup


def test_a_bad_file_is_reported_and_the_stream_goes_on(tmp_path, analyzer):
    good = sorted(CT.glob("*.dcm"))[:4]
    for p in good:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "ct_0002.dcm").write_bytes(good[1].read_bytes()[:3000])  # truncated in its pixel data
    (tmp_path / "notes.txt").write_text("not an image")
    sink = Collect()
    pipe = Pipeline(FileReplay.from_folder(tmp_path, fps=0), analysis_stages(analyzer), [sink])
    assert pipe.run(timeout=300)
    assert len(sink.results) == 3
    bad = [e for e in sink.errors if not e.skippable]
    assert [e.key for e in bad] == [str(tmp_path / "ct_0002.dcm")] and bad[0].stage == "decode"
    assert "ct_0002.dcm" in bad[0].reason
    assert [e.key for e in sink.errors if e.skippable] == [str(tmp_path / "notes.txt")]


def test_stream_command_json_summary(capsys):
    rc = main(["stream", str(CT), "--fps", "0", "--json", "--workers", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["findings"]["frames"] == 40 and out["findings"]["skipped_not_dicom"] == 2
    assert out["findings"]["skipped_no_model"] == 0
    assert out["findings"]["lesions"] > 0
    assert out["pipeline"]["policy"] == "block" and out["pipeline"]["workers"] == 2
    assert out["e2e_ms"]["n"] == 40 - 10 and out["e2e_ms"]["p99"] > 0


def test_stream_replays_two_whole_acquisitions_each_with_its_own_neighbours(tmp_path, capsys):
    """A pre- and a post-contrast pass in one series, replayed by name (the first pass, then
    the second): the replay's file order gave the first pass's last slice the second's first
    as its neighbour (10 mm on), which lost the lesion on that slice. With the replay's slice
    order, each pass ended, each pass finds what the first pass alone finds."""
    first, _ = two_pass_series(tmp_path / "both")
    alone = tmp_path / "alone"
    alone.mkdir()
    for path in first:
        shutil.copy(path, alone / path.name)

    def findings(folder):  # type: ignore[no-untyped-def]
        assert main(["stream", str(folder), "--fps", "0", "--json", "--workers", "1"]) == 0
        f = json.loads(capsys.readouterr().out)["findings"]
        return {k: f[k] for k in ("frames", "positive_frames", "lesions", "lesion_sections")}

    one = findings(alone)
    assert one["lesions"] > 0
    assert findings(tmp_path / "both") == {k: 2 * v for k, v in one.items()}


def test_stream_loops_each_start_afresh(tmp_path, capsys):
    """--loop N replays a series N times: each loop is counted as a replay of its own, so
    the counts are N times one loop's. Three 5 mm slices that each cross one lesion span
    10 mm, so a loop's last slice lies within reach (MAX_GAP_MM) of the next loop's first:
    the lesion count joined them, and the second loop's lesion was the first's again."""
    for p in sorted(CT.glob("*.dcm"))[13:16]:  # ct_0014-16: one lesion on all three
        shutil.copy(p, tmp_path / p.name)

    def findings(loops):  # type: ignore[no-untyped-def]
        assert main(["stream", str(tmp_path), "--fps", "0", "--loop", str(loops), "--json", "--workers", "1"]) == 0
        f = json.loads(capsys.readouterr().out)["findings"]
        assert f["loops"] == loops
        return {k: f[k] for k in ("frames", "positive_frames", "lesions", "lesion_sections")}

    one = findings(1)
    assert one == {"frames": 3, "positive_frames": 3, "lesions": 1, "lesion_sections": 3}
    assert findings(3) == {k: 3 * v for k, v in one.items()}


def test_stream_loops_of_one_multi_frame_file_each_start_afresh(tmp_path, capsys):
    """An enhanced CT holds a series' slices as the frames of one file: a loop is then one
    source item whose frames all share its place (its envelopes' ``seq``), so --loop counts
    each loop's frames as one loop. The three slices of test_stream_loops_each_start_afresh
    in one file, looped twice: twice one loop's sections and lesions, none linked across
    the wrap (the last frame of a loop lies 10 mm from the next loop's first)."""
    import highdicom as hd
    import pydicom
    from pydicom.uid import generate_uid

    datasets = [pydicom.dcmread(p) for p in sorted(CT.glob("*.dcm"))[13:16]]  # ct_0014-16
    hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=datasets, series_instance_uid=generate_uid(), series_number=9,
        sop_instance_uid=generate_uid(), instance_number=1,
    ).save_as(tmp_path / "ct.dcm", enforce_file_format=True)

    def findings(loops):  # type: ignore[no-untyped-def]
        assert main(["stream", str(tmp_path), "--fps", "0", "--loop", str(loops), "--json", "--workers", "1"]) == 0
        f = json.loads(capsys.readouterr().out)["findings"]
        assert f["loops"] == loops
        return {k: f[k] for k in ("frames", "positive_frames", "lesions", "lesion_sections")}

    one = findings(1)
    assert one == {"frames": 3, "positive_frames": 3, "lesions": 1, "lesion_sections": 3}  # one file, linked
    assert findings(2) == {k: 2 * v for k, v in one.items()}


def test_stream_counts_the_lesions_of_an_enhanced_ct_stored_out_of_position_order_as_batch_does(tmp_path, capsys):
    """The stream links each frame's lesions to the frame before it (LesionCounter), and a
    multi-frame file's frames came in the order the file stores them: an enhanced CT stored
    out of position order counted its lesions once per slice (4 for batch's 2 here, on this
    phantom, --watch alike). The decode stage now hands a file's frames on head first."""
    from medrt.io.dicom import read_frames

    src = tmp_path / "in"
    assert main(["phantom", "ct", "--out", str(src), "--seed", "25", "--frames", "20", "--size", "256",
                 "--enhanced", "--shuffle-frames"]) == 0
    z = [f.geometry.position[2] for f in read_frames(src / "ct_enhanced.dcm")]
    assert z != sorted(z) and z != sorted(z, reverse=True)  # stored out of position order
    capsys.readouterr()

    def findings(*how: str) -> dict:
        assert main(["stream", str(src), *how, "--json", "--workers", "1"]) == 0
        f = json.loads(capsys.readouterr().out)["findings"]
        assert f["frames"] == 20 and f["errors"] == 0
        return {k: f[k] for k in ("lesions", "lesion_sections")}

    replayed, watched = findings("--fps", "0"), findings("--watch", "--idle-exit", "1")
    assert main(["batch", str(src), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    with (tmp_path / "out" / "lesions.csv").open() as f:
        batch = sum(1 for _ in f) - 1  # less the header
    assert replayed == watched and replayed["lesions"] == batch < replayed["lesion_sections"]


def test_stream_command_reports_bad_input_with_exit_1(tmp_path, capsys):
    src = sorted(CT.glob("*.dcm"))[0]
    shutil.copy(src, tmp_path / "a.dcm")
    (tmp_path / "b.dcm").write_bytes(src.read_bytes()[:2000])
    rc = main(["stream", str(tmp_path), "--fps", "0", "--quiet", "--histogram", str(tmp_path / "h.png"),
               "--jsonl", str(tmp_path / "t.jsonl")])
    out = capsys.readouterr().out
    assert rc == 1
    assert "b.dcm" in out and "1 unreadable input(s)" in out
    (error,) = [line for line in out.splitlines() if line.startswith("  error: ")]
    assert error.count("b.dcm") == 1, error  # the reason names the file; not named twice
    assert (tmp_path / "h.png").stat().st_size > 0
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["summary"]["frames"] == 1


def test_stream_command_passes_over_dicom_objects_that_are_not_images(tmp_path, capsys):
    """An SR and a DICOMDIR beside the images (a scanner's export, a PACS spool): passed
    over and counted apart, not unreadable inputs, so the run exits 0."""
    from conftest import pydicom_test_dir

    shutil.copy(sorted(CT.glob("*.dcm"))[0], tmp_path / "a.dcm")
    shutil.copy(pydicom_test_dir() / "test-SR.dcm", tmp_path / "report.dcm")
    rc = main(["stream", str(tmp_path), "--fps", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    f = out["findings"]
    assert (f["frames"], f["errors"], f["skipped_not_an_image"], f["skipped_not_dicom"]) == (1, 0, 1, 0)


def test_stream_command_passes_over_a_frame_no_model_is_for(tmp_path, capsys):
    """An MR image among CT slices: not an error (exit 0), counted apart, reason printed."""
    from conftest import pydicom_test_dir

    shutil.copy(sorted(CT.glob("*.dcm"))[0], tmp_path / "a.dcm")
    shutil.copy(pydicom_test_dir() / "MR_small.dcm", tmp_path / "mr.dcm")
    rc = main(["stream", str(tmp_path), "--fps", "0", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "0 unreadable input(s)" in out and "1 frame(s) no model is for" in out
    assert "skipped: " in out and "mr.dcm: MR frame, but" in out


def test_stream_command_missing_source(capsys, tmp_path):
    assert main(["stream", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_stream_watch_picks_up_files_as_they_land(tmp_path, capsys):
    import threading
    import time

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    srcs = sorted(CT.glob("*.dcm"))[14:17]

    def sender():  # a storescu-like sender: write under a temp name, then rename
        for p in srcs:
            part = inbox / (p.name + ".part")
            part.write_bytes(p.read_bytes())
            part.rename(inbox / p.name)
            time.sleep(0.2)

    t = threading.Thread(target=sender)
    t.start()
    rc = main(["stream", str(inbox), "--watch", "--idle-exit", "3", "--json", "--workers", "1"])
    t.join()
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["findings"]["frames"] == 3 and out["findings"]["errors"] == 0
    assert main(["stream", str(inbox), "--lookahead", "2"]) == 2  # a replay knows its order already
    assert "--lookahead" in capsys.readouterr().err


def test_stream_watch_reads_a_slowly_written_file_again_once_it_is_complete(tmp_path, capsys, monkeypatch):
    """A sender that writes in place and stalls mid-file for longer than the watch's settle
    time: the half file fails to decode; once complete it is read again and analysed, and
    the run ends clean (the image was not lost), saying so."""
    import threading
    import time

    from medrt.io.sources import FolderWatch

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    data = sorted(CT.glob("*.dcm"))[15].read_bytes()
    watching = threading.Event()  # the models load first: send once the folder is watched
    snapshot = FolderWatch._snapshot

    def watched_snapshot(self):  # type: ignore[no-untyped-def]
        watching.set()
        return snapshot(self)

    monkeypatch.setattr(FolderWatch, "_snapshot", watched_snapshot)

    def sender():
        assert watching.wait(120)
        with (inbox / "slow.dcm").open("wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            time.sleep(2.5)  # the network stalls
            f.write(data[len(data) // 2:])

    t = threading.Thread(target=sender)
    t.start()
    rc = main(["stream", str(inbox), "--watch", "--idle-exit", "4", "--json", "--workers", "1"])
    t.join()
    f = json.loads(capsys.readouterr().out)["findings"]
    assert (f["frames"], f["errors"], f["error_details"], f["recovered_after_rewrite"]) == (1, 0, [], 1)
    assert rc == 0


def test_a_watched_folder_holds_files_only_as_asked(tmp_path):
    """``--lookahead`` not given: a Lookahead that lets files through until a 2.5-D model's
    decode stage asks for the next slice (then each waits at most half a second); 0: none;
    SECONDS: each held for the next file from the start."""
    from medrt.commands.options import DEFAULT_LOOKAHEAD_S, watch_lookahead
    from medrt.io.sources import FolderWatch, Lookahead

    watch = FolderWatch(tmp_path)
    auto = watch_lookahead(watch, None)
    assert isinstance(auto, Lookahead) and auto.depth == 0 and auto.wait == DEFAULT_LOOKAHEAD_S == 0.5
    assert watch_lookahead(watch, 0) is watch
    held = watch_lookahead(watch, 2.0)
    assert held.depth == 1 and held.wait == 2.0
    one = load_analyzer(seg_model="lesion_unet_lite", threads=1)  # 2.5-D
    analysis_stages(one, ahead=auto)
    assert auto.depth == 1
    flat = watch_lookahead(watch, None)
    analysis_stages(load_analyzer(seg_model="lesion_unet_dx", threads=1), ahead=flat)  # 2-D
    assert flat.depth == 0


def test_process_decoder_gives_the_same_frames_and_errors(tmp_path):
    import numpy as np

    from medrt.errors import CorruptDicomError, InputError, NotDicomError
    from medrt.io.dicom import read_frames
    from medrt.pipeline.stages import ProcessDecoder

    dx = sorted((SAMPLE_DIR / "radiographs").glob("*.dcm"))[0]
    ct = sorted(CT.glob("*.dcm"))[3]
    (tmp_path / "x.txt").write_text("hello")
    (tmp_path / "cut.dcm").write_bytes(ct.read_bytes()[:200])
    dec = ProcessDecoder(1)
    try:
        for path in (dx, ct):
            got = dec(path)
            want = read_frames(path)
            assert [d.frame.key for d in got] == [f.key for f in want]
            assert np.array_equal(got[0].frame.pixels, want[0].pixels)
            assert got[0].frame.window == want[0].window and not got[0].frame.pixels.flags.writeable
            assert got[0].frame.source.dataset.SOPInstanceUID == want[0].sop_instance_uid
        with pytest.raises(NotDicomError) as info:
            dec(tmp_path / "x.txt")
        assert info.value.skippable and "x.txt" in str(info.value)
        with pytest.raises(InputError) as info:
            dec(tmp_path / "cut.dcm")
        assert "cut.dcm" in info.value.source
        assert isinstance(info.value, (CorruptDicomError, InputError))
    finally:
        dec.close()


def test_pipeline_with_decode_processes_matches_threads(analyzer):
    paths = sorted(CT.glob("*.dcm"))[14:18]
    a, b = Collect(), Collect()
    assert Pipeline(FileReplay(paths, fps=0), analysis_stages(analyzer), [a]).run(timeout=300)
    stages = analysis_stages(analyzer, decode_processes=2)
    assert Pipeline(FileReplay(paths, fps=0), stages, [b]).run(timeout=300)
    assert not stages[0].fn.running  # the pipeline closed its decode pool when it finished
    assert [r.frame.key for r in a.results] == [r.frame.key for r in b.results]
    assert [[les.bbox for les in r.lesions] for r in a.results] == [[les.bbox for les in r.lesions] for r in b.results]


def test_process_analysis_matches_threads_and_reports_bad_files(tmp_path, analyzer):
    """The processes layout: every frame analysed in a worker process gives what the
    threads give (lesions, label maps, crops, in source order), per-step timings still
    reach the telemetry, and a bad file is named and skipped past."""
    import numpy as np

    good = sorted(CT.glob("*.dcm"))[12:18]
    for p in good:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / good[2].name).write_bytes(good[2].read_bytes()[:3000])  # truncated in its pixel data
    order = sorted(tmp_path.glob("*.dcm"))  # the neighbours of each slice, in both layouts
    a, b = Collect(), Collect()
    assert Pipeline(FileReplay.from_folder(tmp_path, fps=0), analysis_stages(analyzer, order=order),
                    [a]).run(timeout=300)
    stages = analysis_stages(analyzer, processes=2, order=order)
    assert [s.name for s in stages] == ["analyze"]
    pipe = Pipeline(FileReplay.from_folder(tmp_path, fps=0), stages, [b], telemetry=True)
    assert pipe.run(timeout=300)
    assert not stages[0].fn.running  # closed with the pipeline
    assert len(b.results) == 5 and [r.frame.key for r in a.results] == [r.frame.key for r in b.results]
    for x, y in zip(a.results, b.results, strict=True):
        assert [les.bbox for les in x.lesions] == [les.bbox for les in y.lesions]
        assert np.array_equal(x.labels, y.labels) and x.crops == y.crops
        assert not y.labels.flags.writeable and not y.frame.pixels.flags.writeable
        assert y.timings.segment > 0 and y.timings.decode > 0
    assert [e.key for e in b.errors] == [str(tmp_path / good[2].name)]
    assert good[2].name in b.errors[0].reason and b.errors[0].stage == "analyze"
    assert pipe.telemetry.summary()["frames"] == 5


def test_a_watched_folder_with_lookahead_finds_what_the_replay_finds(tmp_path, analyzer):
    """Files landing one by one in a watched folder, held until the next one arrives
    (Lookahead): the 2.5-D model gets both neighbours, so the findings equal those of
    a replay of the same files in order."""
    import threading
    import time

    from medrt.io.sources import FolderWatch, Lookahead

    srcs = sorted(CT.glob("*.dcm"))[13:19]  # slices with lesions in the sample
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def sender():  # write under a temp name, then rename, as storescu-like senders do
        for p in srcs:
            part = inbox / (p.name + ".part")
            part.write_bytes(p.read_bytes())
            part.rename(inbox / p.name)
            time.sleep(0.1)

    ahead = Lookahead(FolderWatch(inbox, poll=0.05, settle=0.2, idle_timeout=2.0), wait=3.0)
    live = Collect()
    t = threading.Thread(target=sender)
    t.start()
    assert Pipeline(ahead, analysis_stages(analyzer, ahead=ahead), [live]).run(timeout=120)
    t.join()
    replay = Collect()
    assert Pipeline(FileReplay(srcs, fps=0), analysis_stages(analyzer, order=srcs), [replay]).run(timeout=120)
    assert len(live.results) == len(replay.results) == 6 and not live.errors
    assert _lesions_by_frame(live.results) == _lesions_by_frame(replay.results)
    assert any(_lesions_by_frame(replay.results).values())
    # Without the lookahead a slice lacks the one after it, and the findings differ on this run.
    plain = Collect()
    assert Pipeline(FileReplay(srcs, fps=0), analysis_stages(analyzer), [plain]).run(timeout=120)
    assert _lesions_by_frame(plain.results) != _lesions_by_frame(replay.results)


def test_a_watched_thin_series_finds_what_the_replay_finds(tmp_path, analyzer):
    """A 1 mm series landing in a watched folder, for a model that learnt 3 mm
    neighbours (``[model] neighbour_mm``), with the watch's default Lookahead (depth 0: the
    2.5-D decode stage asks for the next file when it is made): from the first two slices
    the decode stage learns the spacing and the Lookahead holds three files, so from the second slice on
    every slice gets the slices 3 mm away and the findings equal a replay's in order.
    The next slices instead (what a live source gave before) find other things."""
    import threading
    import time

    from medrt.io.sources import FolderWatch, Lookahead
    from medrt.phantom.folders import write_ct_series

    assert analyzer.neighbour_mm == 3.0
    srcs = write_ct_series(tmp_path / "thin", 40, n_frames=14, thickness_mm=1.0)
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def sender():
        for p in srcs:
            part = inbox / (p.name + ".part")
            part.write_bytes(p.read_bytes())
            part.rename(inbox / p.name)
            time.sleep(0.1)

    ahead = Lookahead(FolderWatch(inbox, poll=0.05, settle=0.2, idle_timeout=2.0), wait=3.0, depth=0)
    live = Collect()
    t = threading.Thread(target=sender)
    t.start()
    assert Pipeline(ahead, analysis_stages(analyzer, ahead=ahead), [live]).run(timeout=120)
    t.join()
    assert ahead.depth == 3 and not live.errors
    replay = Collect()
    assert Pipeline(FileReplay(srcs, fps=0), analysis_stages(analyzer, order=srcs), [replay]).run(timeout=120)
    plain = Collect()  # each slice with the next ones, as before
    assert Pipeline(FileReplay(srcs, fps=0), analysis_stages(analyzer), [plain]).run(timeout=120)
    first = replay.results[0].frame.sop_instance_uid  # its neighbour after was the next file
    got, want, near = (
        {k: v for k, v in _lesions_by_frame(c.results).items() if k != first} for c in (live, replay, plain)
    )
    assert len(got) == len(want) == 13 and any(want.values())
    assert got == want
    assert near != want


def test_worker_processes_on_a_live_source_warn_that_the_slices_lose_their_neighbours(analyzer, caplog):
    """Without a file order each worker process sees only some of the files, so a 2.5-D
    model gets no neighbours there: said once, when the stages are made."""
    stages = analysis_stages(analyzer, processes=1)  # no order: a watched folder, a queue
    try:
        assert any("no neighbouring slices" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    finally:
        stages[0].fn.close()
    caplog.clear()
    analysis_stages(analyzer)  # threads: each slice gets the one before it, no warning
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_stream_command_with_processes(capsys):
    rc = main(["stream", str(CT), "--fps", "0", "--json", "--processes", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["frames"] == len(list(CT.glob("*.dcm")))


def test_a_crashed_worker_costs_its_file_and_the_pool_is_replaced():
    """A worker process that dies mid-file (a native crash in a codec) is reported as
    corrupt pixel data naming that file; the next file gets a fresh pool."""
    import os

    from medrt.errors import CorruptPixelDataError
    from medrt.pipeline.stages import ProcessDecoder

    dec = ProcessDecoder(1)
    try:
        with pytest.raises(CorruptPixelDataError) as info:
            dec.call(os._exit, 3, "crash.dcm")  # the worker exits as a segfaulting codec would
        assert "crash.dcm" in str(info.value) and "crashed" in str(info.value)
        ct = sorted(CT.glob("*.dcm"))[0]
        assert dec(ct)[0].frame.rows == 512  # a fresh pool serves the next file
    finally:
        dec.close()


def test_stream_stopped_by_sigterm_prints_its_summary_as_ctrl_c_does(tmp_path):
    """`timeout`, systemd or a job scheduler stop with SIGTERM: the stream ended at once
    (exit 143) with no summary and no --json; it now stops as Ctrl-C does (exit 130)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO, SAMPLE_DIR

    cmd = [sys.executable, "-m", "medrt", "stream", str(SAMPLE_DIR / "ct_stream"), "--fps", "5", "--loop", "20",
           "--json", "--model", "lesion_unet_lite", "--threads", "1"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(20)  # models loaded (about 3 s here), frames flowing at 5 per second
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert 0 < summary["findings"]["frames"] < 800 and summary["frames"] > 0, out  # stopped part-way, summarised


def test_a_frame_whose_spacing_is_not_a_length_is_warned_of_as_such(analyzer, tmp_path, caplog):  # type: ignore[no-untyped-def]
    """The analyzer said "no pixel spacing in the header" also of a frame whose spacing was
    there but could not be used (0\\0, NaN, 1e300). It now says which it was, and which frame
    of a multi-frame object."""
    import highdicom as hd
    import pydicom
    from pydicom.dataset import Dataset
    from pydicom.uid import generate_uid

    from medrt.io.dicom import read_frames

    slices = [pydicom.dcmread(p) for p in sorted(CT.glob("*.dcm"))[10:12]]
    enhanced = hd.legacy.LegacyConvertedEnhancedCTImage(
        legacy_datasets=slices, series_instance_uid=generate_uid(), series_number=9,
        sop_instance_uid=generate_uid(), instance_number=1, include_dimension_index=False)
    shared = enhanced.SharedFunctionalGroupsSequence[0]
    for group, spacing in zip(enhanced.PerFrameFunctionalGroupsSequence, (shared.PixelMeasuresSequence[0].PixelSpacing,
                                                                           ["0", "0"]), strict=True):
        measures = Dataset()
        measures.PixelSpacing, measures.SliceThickness = spacing, shared.PixelMeasuresSequence[0].SliceThickness
        group.PixelMeasuresSequence = [measures]
    del shared.PixelMeasuresSequence
    path = tmp_path / "enhanced.dcm"
    enhanced.save_as(path, enforce_file_format=True)
    frames = {f.frame_index: f for f in read_frames(path)}
    assert frames[0].spacing_mm is not None and frames[1].spacing_mm is None
    with caplog.at_level("WARNING", logger="medrt.analyzer"):
        analyzer.analyze(frames[1], mode="full")
    (said,) = [r.getMessage() for r in caplog.records if "pixel spacing" in r.getMessage()]
    assert said.startswith(f"{path}, frame 2 of 2: no usable pixel spacing (PixelSpacing 0\\0 is not a length in mm): ")
    assert "no pixel spacing in the header" not in said
