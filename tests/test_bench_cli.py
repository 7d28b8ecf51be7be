"""``medrt bench`` end to end: the pipeline suites' JSON keys, --stream-frames, --compare and --profile-layers."""

from __future__ import annotations

import copy
import json

from conftest import REPO
from medrt.cli import main
from medrt.engine.registry import load_spec


def test_pipeline_suites_json_keys_and_compare(tmp_path, capsys):
    rc = main(["bench", "--only", "pipelined,stream", "--stream-loops", "1", "--stream-frames", "40",
               "--fps", "60", "--repeats", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    pvs = out["pipelined_vs_serial"]
    assert pvs["speedup"] > 0 and pvs["frames"] == 40 and pvs["model_only_ms_per_frame"] > 0
    assert pvs["serial_baseline"] in pvs["fps"] and pvs["errors"] == 0  # the sample stream decodes
    s = out["stream_30fps"]
    assert set(s) >= {"fps", "drops", "p99_ms"} and s["frames"] == 40
    assert s["analysed"] + s["drops"] == 40 and s["errors"] == 0

    base = tmp_path / "base.json"
    base.write_text(json.dumps(out))
    assert main(["bench", "--only", "pipelined", "--stream-loops", "1", "--repeats", "3", "--json",
                 "--compare", str(base), "--tolerance", "10"]) == 0  # a 1000 % tolerance never trips
    capsys.readouterr()
    faster = copy.deepcopy(out)
    faster["pipelined_vs_serial"]["speedup"] = pvs["speedup"] * 100  # a baseline we cannot reach
    base.write_text(json.dumps(faster))
    assert main(["bench", "--only", "pipelined", "--stream-loops", "1", "--repeats", "3",
                 "--compare", str(base)]) == 1
    assert "speedup" in capsys.readouterr().out


def test_profile_layers_prints_the_slowest_nodes(capsys):
    assert main(["bench", "--only", "decode", "--size", "256", "--repeats", "3", "--profile-layers",
                 "--profile-size", "256", "--model", "lesion_unet_lite"]) == 0
    out = capsys.readouterr().out
    assert "slowest nodes of lesion_unet_lite" in out and "Conv" in out
    assert "graph: as medrt's CPU session runs it, rewritten (8 skip-connection Concat" in out  # not the file's


def test_precision_int8_runs_the_gated_twins_and_the_engine_table_lists_int8(capsys):
    # lesion_unet: its twin passes the gate of the tests' small set (conftest: one CT series,
    # three radiographs), where lesion_unet_lite 4.0's was refused by one lesion of 29 (it
    # passes the default set, README) and the table would give the refusal as the int8 row's error
    rc = main(["bench", "--only", "engines,stream", "--model", "lesion_unet", "--stream-model", "lesion_unet",
               "--precision", "int8", "--stream-frames", "40", "--fps", "60", "--repeats", "3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["backend"], r["device"], r["precision"]): r for r in out["engines"]}
    fp32, int8 = rows[("onnxruntime", "cpu", "fp32")], rows[("onnxruntime", "cpu", "int8")]
    unet = load_spec(REPO / "models" / "lesion_unet.toml").ident
    assert fp32["model"] == unet and int8["model"] == f"{unet}+int8", int8
    assert int8["p50_ms"] > 0 and "error" not in int8
    s = out["stream_30fps"]
    assert s["model"].endswith("+int8") and s["analysed"] + s["drops"] == 40 and s["errors"] == 0


def test_each_engine_row_counts_the_memory_its_own_backend_takes():
    """An engine row's ``memory_mb`` is its backend's. With the ORT sessions in the process's
    one arena (medrt's default) a row counted only what the rows and suites before it had
    not grown the arena by: ``lesion_unet`` at 512², the table twice in one process gave
    fp32 +84 then +25 MB and int8 +19 then +4 (each on its own: +84/+69 and +56/+56).
    After the test above, lesion_unet's INT8 twin is in the tests' cache."""
    from medrt.bench.engine import engine_table

    def table() -> dict[tuple[str, str, str], dict]:
        rows = engine_table("lesion_unet", size=512, repeats=3)
        return {(r["backend"], r["device"], r["precision"]): r for r in rows}

    first, again = table(), table()
    fp32 = ("onnxruntime", "cpu", "fp32")
    assert first[fp32]["memory_mb"] > 30, first[fp32]  # the measure sees an arena
    ran = [k for k in first if "error" not in first[k] and "error" not in again[k]]
    assert fp32 in ran and ("onnxruntime", "cpu", "int8") in ran, (first, again)
    for key in ran:
        assert again[key]["memory_mb"] > first[key]["memory_mb"] / 2, (key, first[key], again[key])


def test_a_bad_baseline_is_refused_before_any_benchmark_runs(tmp_path, capsys):
    # The stream suite with a model that does not exist: had the suite started, its model
    # load would fail first ("no shipped model"). Each baseline is refused before that.
    wrong = tmp_path / "decode.json"
    wrong.write_text(json.dumps({"decode": {"size": 256, "repeats": 3, "rows": []}}))
    unreadable = tmp_path / "folder.json"
    unreadable.mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[]")
    cases = {"missing.json": "no such baseline file", "bad.json": "not a bench JSON file",
             "folder.json": "not a bench JSON file", "list.json": "not a bench JSON object",
             "decode.json": "no result of stream_30fps to compare with (the baseline holds decode)"}
    for name, reason in cases.items():
        rc = main(["bench", "--only", "stream", "--stream-model", "no_such_model", "--compare", str(tmp_path / name)])
        out, err = capsys.readouterr()
        assert rc == 2, name
        assert f"{tmp_path / name}: {reason}" in err and "no shipped model" not in err, err
        assert "== stream_30fps" not in out
    wrong.write_text(json.dumps({"stream_30fps": {}}))
    assert main(["bench", "--only", "stream", "--stream-model", "no_such_model", "--compare", str(wrong),
                 "--tolerance", "-0.1"]) == 2
    err = capsys.readouterr().err
    assert "--tolerance must be >= 0" in err and "no shipped model" not in err


def test_stream_frames_are_replayed_exactly_and_another_rate_is_not_compared(tmp_path, capsys):
    # 50 frames: one pass over the 40-slice sample series and 10 of the next (it used to run 80)
    assert main(["bench", "--only", "stream", "--stream-frames", "50", "--fps", "60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["stream_30fps"]
    assert s["frames"] == 50 and s["analysed"] + s["drops"] + s["errors"] == 50, s

    base = tmp_path / "base.json"
    s["target_fps"] = 30.0  # the baseline ran at another rate: its figures are not these
    base.write_text(json.dumps(out))
    assert main(["bench", "--only", "stream", "--stream-frames", "50", "--fps", "60", "--compare", str(base),
                 "--tolerance", "10"]) == 1
    text = capsys.readouterr().out
    assert "not comparable" in text and "stream_30fps.target_fps: 30.0 in the baseline, 60.0 now" in text


def test_pipelined_vs_serial_counts_the_frames_that_failed(tmp_path):
    """Each layout's fps counts the frames analysed; frames that failed are reported beside
    them (so --compare sees a broken run), not left out silently."""
    import shutil

    from conftest import SAMPLE_DIR
    from medrt.bench.pipeline import pipelined_vs_serial

    slices = sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))
    for p in slices[14:17]:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "zz_cut.dcm").write_bytes(slices[20].read_bytes()[:4000])
    r = pipelined_vs_serial(folder=tmp_path, loops=1, repeats=1, processes=0, workers=1)
    # one bad file, once per timed run: serial on 1 thread (and on every core), pipelined
    runs = 3 if r["cores"] > 1 else 2
    assert r["errors"] == runs and r["frames"] == 4


def test_pipeline_bench_gives_the_neighbours_medrt_stream_gives(tmp_path, capsys):
    """The pipeline suites replay a folder by name, as `medrt stream` does, and took the
    2.5-D model's neighbours from that name order: on a series of two whole acquisitions
    the first pass's last slice took the second pass's first as its neighbour and lost
    its lesion, so the bench measured a pipeline no user runs. It now takes the slice
    order with each pass ended, and finds what the stream finds, in every layout."""
    from conftest import two_pass_series
    from medrt.bench.pipeline import pipelined_vs_serial, stream_replay

    two_pass_series(tmp_path)
    assert main(["stream", str(tmp_path), "--fps", "0", "--json", "--workers", "1"]) == 0
    stream = json.loads(capsys.readouterr().out)["findings"]["lesion_sections"]
    r = pipelined_vs_serial(folder=tmp_path, loops=1, repeats=1, processes=0, workers=1)
    assert r["frames"] == 6 and r["errors"] == 0 and r["lesion_sections"] == [stream]
    s = stream_replay(folder=tmp_path, fps=0, frames=6, policy="block", workers=1)  # nothing dropped
    assert (s["analysed"], s["errors"], s["lesion_sections"]) == (6, 0, stream)


def test_series_outputs_suite_json_keys_frames_and_compare(tmp_path, capsys, monkeypatch):
    """`--only series_outputs --frames N`: N slices, its figures in ms, which --compare reads
    as timings (a baseline ten times faster is a regression), and its memory, which it
    compares too (a baseline that allocated 100 MB more: an improvement)."""
    monkeypatch.setenv("MEDRT_CACHE", str(tmp_path / "cache"))  # the phantom is written here, not in ~/.cache
    assert main(["bench", "--only", "series_outputs", "--frames", "12", "--repeats", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["series_outputs"]
    assert row["frames"] == 12 and row["repeats"] == 1 and row["total_ms"] > 0 and row["peak_mb"] > 0
    assert {"link_ms", "seg_ms", "sr_ms", "write_ms"} <= set(row)
    faster = copy.deepcopy(out)
    faster["series_outputs"]["total_ms"] = row["total_ms"] / 10
    faster["series_outputs"]["peak_mb"] = row["peak_mb"] + 100
    base = tmp_path / "base.json"
    base.write_text(json.dumps(faster))
    assert main(["bench", "--only", "series_outputs", "--frames", "12", "--repeats", "3",
                 "--compare", str(base)]) == 1
    text = capsys.readouterr().out
    assert "series_outputs.total_ms" in text.split("improvement(s):")[0]
    assert "series_outputs.peak_mb" in text.split("improvement(s):")[1].split("notes:")[0]


def test_pipeline_suites_replay_what_batch_takes_named_dcm_or_not(tmp_path):
    """A PACS export or `medrt listen`'s spool names its files without `.dcm`: the pipeline
    suites took only `*.dcm` and refused such a folder ("no *.dcm files"). They take the
    files `medrt batch` takes (its walk and grouping; a sidecar or a hidden file passed
    over), with the neighbours from the slice order as before, and find the same lesions."""
    import shutil

    import pydicom

    from conftest import two_pass_series
    from medrt.batch.plan import scan
    from medrt.bench.pipeline import _dicom_paths, stream_replay

    first, second = two_pass_series(tmp_path / "named")
    spool = tmp_path / "spool"
    (spool / "more").mkdir(parents=True)
    for i, path in enumerate(first + second):  # named by SOPInstanceUID: by name, not by pass or slice
        uid = pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID
        shutil.copy(path, spool / ("more" if i % 2 else ".") / uid)
    (spool / "truth.json").write_text("{}")  # not DICOM: batch passes over it, so does the bench
    shutil.copy(first[0], spool / ".hidden")
    taken = sorted(p for sp in scan(spool).series for p in sp.paths)
    assert len(taken) == 6 and _dicom_paths(spool) == taken

    named = stream_replay(folder=tmp_path / "named", fps=0, frames=6, policy="block", workers=1)
    s = stream_replay(folder=spool, fps=0, frames=6, policy="block", workers=1)
    assert (s["analysed"], s["errors"], s["lesion_sections"]) == (6, 0, named["lesion_sections"])
    assert named["lesion_sections"] > 0


def test_listener_memory_suite_reads_the_listeners_memory_after_each_series(capsys):
    """`--only listener_memory --series N`: `medrt listen` in a process of its own is sent
    N new series one after another; its resident memory after the warm-up (2 series) and
    after the last, the growth between them, and each series' reading. Figures only, no
    bound (a bound on RSS would fail by chance); what the listener keeps per series is
    tested in test_pacs.py. Fewer than 3 series is refused before anything runs."""
    assert main(["bench", "--only", "listener_memory", "--series", "2", "--json"]) == 2
    assert "--series must be at least 3" in capsys.readouterr().err
    assert main(["bench", "--only", "listener_memory", "--series", "3", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["listener_memory"]
    assert (row["series"], row["warmup_series"], row["images_per_series"]) == (3, 2, 40)
    assert len(row["rss_mb"]) == 3 and row["rss_after_warmup_mb"] == row["rss_mb"][1]
    assert row["rss_last_mb"] == row["rss_mb"][2] and row["rss_peak_mb"] >= max(row["rss_mb"]) > row["rss_start_mb"] > 0
    assert abs(row["mb_per_series"] - (row["rss_last_mb"] - row["rss_after_warmup_mb"])) <= 0.1  # one series after
    assert row["mb_per_series_last_half"] == row["mb_per_series"]  # of one series, the later half is that one
    assert len(row["lesions"]) == 1 and row["lesions"][0] > 0  # each copy of the series: the same lesions


def test_stream_folder_replays_the_users_series_and_compare_takes_it_as_a_setting(tmp_path, capsys):
    """`--stream-folder PATH`: the pipelined and stream suites replay the user's series (here
    five slices of the sample, named without .dcm as a PACS export names them) instead of the
    sample stream, and say which folder in their results; --compare takes another folder as
    another run setting, a baseline saved before the setting existed as the sample stream's.
    A folder that is not there, or holds no DICOM image, is refused before any suite runs."""
    import shutil

    from conftest import SAMPLE_DIR

    series = tmp_path / "series"
    series.mkdir()
    for path in sorted((SAMPLE_DIR / "ct_stream").glob("*.dcm"))[14:19]:
        shutil.copy(path, series / path.stem)
    (series / "notes.txt").write_text("not DICOM: passed over")
    args = ["bench", "--only", "pipelined,stream", "--stream-folder", str(series), "--stream-loops", "1",
            "--stream-frames", "7", "--fps", "60", "--repeats", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    pvs, s = out["pipelined_vs_serial"], out["stream_30fps"]
    assert pvs["folder"] == s["folder"] == str(series.resolve())
    assert pvs["frames"] == 5 and pvs["errors"] == 0  # the five slices, one pass
    assert s["frames"] == 7 and s["analysed"] + s["drops"] + s["errors"] == 7  # the five, then two again

    base = tmp_path / "base.json"
    base.write_text(json.dumps(out))
    stream = ["bench", "--only", "stream", "--stream-frames", "7", "--fps", "60", "--json"]
    assert main([*stream, "--compare", str(base), "--tolerance", "10"]) == 1  # the sample stream now
    captured = capsys.readouterr()
    sample = json.loads(captured.out)["stream_30fps"]
    assert sample["folder"] is None and sample["frames"] == 7
    assert "1 run setting(s) differ" in captured.err
    assert f"stream_30fps.folder: {str(series.resolve())!r} in the baseline, the sample stream now" in captured.err

    del sample["folder"]  # a baseline of the sample stream saved before the folder was reported
    base.write_text(json.dumps({"stream_30fps": sample}))
    assert main([*stream, "--stream-folder", str(series), "--compare", str(base), "--tolerance", "10"]) == 1
    err = capsys.readouterr().err
    assert f"stream_30fps.folder: the sample stream in the baseline, {str(series.resolve())!r} now" in err

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README").write_text("no images here")
    cases = {tmp_path / "missing": "no such folder", empty: "no DICOM images", series / "notes.txt": "not a folder"}
    for folder, reason in cases.items():  # refused before the suite's model load (no such model) or any run
        rc = main(["bench", "--only", "pipelined", "--stream-model", "no_such_model", "--stream-folder", str(folder)])
        out, err = capsys.readouterr()
        assert rc == 2, folder
        assert f"medrt bench: --stream-folder {folder}: {reason} for the stream benchmark" in err, err
        assert "no shipped model" not in err and "== pipelined_vs_serial" not in out
