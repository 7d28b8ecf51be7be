"""Bench tools: ORT per-node profile of a shipped model, and the baseline comparison."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from medrt.bench.compare import (
    MEMORY_FLOOR_MB,
    MEMORY_FLOOR_POINTS,
    BenchDiff,
    Regression,
    compare,
    diff_bench,
    direction,
    format_regressions,
    load_bench_json,
)
from medrt.bench.profile import format_graph, format_profile, parse_profile, profile_layers

# -- profile ------------------------------------------------------------------


def test_profile_layers_on_the_lite_unet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # so we can see the trace is cleaned up
    rows = profile_layers("lesion_unet_lite", shape=(256, 256), runs=2, top=8, threads=1)
    assert 0 < len(rows) <= 8
    assert set(rows[0]) == {"node", "op_type", "total_ms", "mean_ms", "share"}
    totals = [r["total_ms"] for r in rows]
    assert totals == sorted(totals, reverse=True)
    assert all(r["total_ms"] >= r["mean_ms"] >= 0 and 0 <= r["share"] <= 1 for r in rows)
    assert sum(r["share"] for r in rows) <= 1.0 + 1e-3  # rounding to 4 places
    assert any("Conv" in r["op_type"] for r in rows), [r["op_type"] for r in rows]
    assert list(tmp_path.iterdir()) == [], "the ORT trace file was left behind"
    text = format_profile(rows)
    assert rows[0]["op_type"] in text and "share" in text


def _optimized_nodes(model: Any, tmp: Path) -> dict[str, str]:
    """Node name -> op type of the graph ORT runs for ``model`` (a path or serialized bytes) on the
    CPU at medrt's optimisation level, from ORT's own saved optimized model."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3  # its warning that an NCHWc graph is for this machine only
    opts.optimized_model_filepath = str(tmp / "optimized.onnx")
    ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return {n.name: n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node}


def test_profile_layers_profiles_the_graph_the_session_runs(tmp_path: Path) -> None:
    """The profile is of the graph medrt's CPU session runs: its skip-connection Concat
    nodes rewritten as sums of convolutions (concat_as_sum), then ORT's fusions. It
    profiled the file as it is, whose Concat nodes the session no longer has."""
    import onnx

    from medrt.engine.registry import find_spec
    from medrt.engine.rewrite import concat_as_sum

    spec = find_spec("lesion_unet_lite")
    rewritten, concats = concat_as_sum(onnx.load(str(spec.path)))
    assert concats, "the lite UNet's skip connections are rewritten"
    (tmp_path / "rw").mkdir()
    (tmp_path / "file").mkdir()
    runs = _optimized_nodes(rewritten.SerializeToString(), tmp_path / "rw")

    rows = profile_layers("lesion_unet_lite", shape=(64, 64), runs=1, top=10_000, threads=1)
    assert {r["node"]: r["op_type"] for r in rows} == runs  # every node that runs, and only those
    assert not {r["node"] for r in rows} & set(concats), "a Concat the session no longer has was profiled"
    assert rows.graph["rewritten"] is True and sorted(rows.graph["rewrites"]["concat_as_sum"]) == sorted(concats)
    assert rows.graph["model"] == spec.ident and rows.graph["shape"] == [64, 64] and rows.graph["runs"] == 1
    assert "rewritten (8 skip-connection Concat" in format_graph(rows.graph)
    doc = json.loads(json.dumps({"profile_layers": rows, "profile_graph": rows.graph}))
    assert doc["profile_layers"] == list(rows) and doc["profile_graph"]["rewritten"] is True

    # the file's graph on request, for a profile to compare with: its Concat nodes are back
    plain = profile_layers("lesion_unet_lite", shape=(64, 64), runs=1, top=10_000, threads=1, split_concats=False)
    assert {r["node"]: r["op_type"] for r in plain} == _optimized_nodes(str(spec.path), tmp_path / "file")
    assert set(concats) <= {r["node"] for r in plain if r["op_type"] == "Concat"}
    assert plain.graph["rewritten"] is False and plain.graph["rewrites"] == {"concat_as_sum": []}
    assert format_graph(plain.graph) == "graph: the model file's, as it is"


def test_profile_layers_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        profile_layers("lesion_unet_lite", shape=(250, 256), runs=1)
    with pytest.raises(ValueError, match='"runs"'):
        profile_layers("lesion_unet_lite", shape=(256, 256), runs=0)


def _node(name: str, op: str, ts: float, dur: float) -> dict[str, Any]:
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_parse_profile_skips_the_warmup_run_and_sums_per_node() -> None:
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        _node("conv1", "Conv", 1, 90),  # warm-up run: left out
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
        _node("conv1", "Conv", 201, 30),
        _node("relu1", "Relu", 240, 10),
        {"cat": "Node", "name": "conv1_fence_before", "ts": 241, "dur": 1000},  # not a kernel
        {"cat": "Session", "name": "model_run", "ts": 400, "dur": 100},
        _node("conv1", "Conv", 401, 50),
        _node("relu1", "Relu", 460, 10),
    ]
    rows = parse_profile(events)
    assert rows == [
        {"node": "conv1", "op_type": "Conv", "total_ms": 0.08, "mean_ms": 0.04, "share": 0.8},
        {"node": "relu1", "op_type": "Relu", "total_ms": 0.02, "mean_ms": 0.01, "share": 0.2},
    ]


# -- compare --------------------------------------------------------------------

BASELINE: dict[str, Any] = {
    "decode": {"size": 4096, "repeats": 9, "rows": [
        {"syntax": "RLE Lossless", "pydicom_ms": 100.0, "medrt_ms": 80.0, "ratio": 0.8},
        {"syntax": "JPEG 2000 Lossless", "pydicom_ms": 400.0, "medrt_ms": 200.0, "ratio": 0.5},
    ]},
    "engines": [
        {"backend": "onnxruntime", "device": "cpu", "precision": "fp32", "size": 1024, "p50_ms": 100.0,
         "p99_ms": 120.0, "memory_mb": 40.0},
        {"backend": "onnxruntime", "device": "cpu", "precision": "int8", "size": 1024, "p50_ms": 60.0,
         "p99_ms": 70.0, "memory_mb": 30.0},
    ],
    "roi_vs_full": {"frames": 4, "size": 4096, "roi_ms_p50": 300.0, "full_ms_p50": 3000.0, "speedup": 10.0,
                    "sensitivity_roi": 0.9},
    "int8_vs_fp32": {"fp32_ms_p50": 100.0, "int8_ms_p50": 60.0, "speedup": 1.67, "gate_passed": True},
    "cold_start": {"load_ms": 500.0, "first_ms": 200.0, "steady_ms_p50": 100.0, "ratio": 2.0},
    "unet_efficiency": {"unet_ms_p50": 100.0, "achieved_gflops": 50.0, "sgemm_gflops": 200.0, "efficiency": 0.25},
}


def _changed(path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASELINE)
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def test_identical_runs_have_no_regressions() -> None:
    diff = diff_bench(copy.deepcopy(BASELINE), BASELINE)
    assert diff.ok and diff.regressions == () and diff.notes == ()
    assert diff.checked >= 15  # the figures were really compared, not skipped
    assert format_regressions(diff).startswith("no regressions beyond 15%")


def test_a_stage_30_percent_slower_is_flagged_and_5_percent_is_not() -> None:
    slower = _changed(["engines", 0, "p50_ms"], 130.0)
    found = compare(slower, BASELINE)
    assert found == [Regression("engines[onnxruntime/cpu/fp32/1024].p50_ms", 100.0, 130.0, pytest.approx(0.3))]
    assert compare(_changed(["engines", 0, "p50_ms"], 105.0), BASELINE) == []
    assert compare(_changed(["engines", 0, "p50_ms"], 70.0), BASELINE) == []  # faster is fine
    assert compare(_changed(["roi_vs_full", "roi_ms_p50"], 400.0), BASELINE)[0].key == "roi_vs_full.roi_ms_p50"
    assert compare(slower, BASELINE, tolerance=0.35) == []


def test_speedup_and_efficiency_drops_are_regressions() -> None:
    found = compare(_changed(["roi_vs_full", "speedup"], 7.0), BASELINE)
    assert [(r.key, r.change) for r in found] == [("roi_vs_full.speedup", pytest.approx(-0.3))]
    assert compare(_changed(["roi_vs_full", "speedup"], 14.0), BASELINE) == []
    assert [r.key for r in compare(_changed(["unet_efficiency", "efficiency"], 0.2), BASELINE)] == [
        "unet_efficiency.efficiency"]
    assert [r.key for r in compare(_changed(["int8_vs_fp32", "gate_passed"], False), BASELINE)] == [
        "int8_vs_fp32.gate_passed"]


def test_ratio_direction_follows_what_each_suite_measures() -> None:
    # decode ratio is medrt_ms / pydicom_ms, cold_start ratio is first / steady: both lower is better
    assert direction("decode.rows[].ratio", "ratio") == "lower"
    assert direction("cold_start.ratio", "ratio") == "lower"
    assert direction("something.ratio", "ratio") == "unknown"
    worse = _changed(["decode", "rows", 0, "ratio"], 1.0)
    assert [r.key for r in compare(worse, BASELINE)] == ["decode.rows[RLE Lossless].ratio"]
    assert compare(_changed(["decode", "rows", 0, "ratio"], 0.5), BASELINE) == []
    assert [r.key for r in compare(_changed(["cold_start", "ratio"], 3.0), BASELINE)] == ["cold_start.ratio"]
    # pydicom is the reference measured beside us: its time is not our regression
    assert compare(_changed(["decode", "rows", 0, "pydicom_ms"], 200.0), BASELINE) == []
    unknown = diff_bench({"x": {"ratio": 5.0}}, {"x": {"ratio": 1.0}})
    assert unknown.ok and any("no known direction" in n for n in unknown.notes)


def test_rows_are_matched_by_identity_not_position() -> None:
    current = copy.deepcopy(BASELINE)
    current["engines"].reverse()
    current["decode"]["rows"].reverse()
    assert compare(current, BASELINE) == []
    current["engines"][0]["p99_ms"] = 100.0  # now the int8 row (70 ms in the baseline)
    assert [r.key for r in compare(current, BASELINE)] == ["engines[onnxruntime/cpu/int8/1024].p99_ms"]


def test_missing_keys_and_rows_are_notes_not_regressions() -> None:
    current = copy.deepcopy(BASELINE)
    del current["cold_start"]
    del current["roi_vs_full"]["speedup"]
    current["engines"].append({"backend": "onnxruntime", "device": "cuda", "precision": "fp32",
                               "error": "no CUDAExecutionProvider"})
    diff = diff_bench(current, BASELINE)
    assert diff.ok
    text = "\n".join(diff.notes)
    assert "cold_start: in the baseline only" in text
    assert "roi_vs_full.speedup: in the baseline only" in text
    assert "engines[onnxruntime/cuda/fp32]: new, not in the baseline" in text


def test_format_regressions_lists_each_change() -> None:
    current = _changed(["engines", 0, "p50_ms"], 130.0)
    current["roi_vs_full"]["speedup"] = 20.0
    diff = diff_bench(current, BASELINE)
    assert isinstance(diff, BenchDiff) and not diff.ok
    text = format_regressions(diff)
    assert "1 regression(s) beyond 15%" in text
    assert "engines[onnxruntime/cpu/fp32/1024].p50_ms: 100 -> 130 (+30.0%)" in text
    assert "roi_vs_full.speedup: 10 -> 20 (+100.0%)" in text  # listed as an improvement
    assert format_regressions(list(diff.regressions), tolerance=0.1).startswith("1 regression(s) beyond 10%")


def test_compare_reads_a_telemetry_summary() -> None:
    base = {"pipeline": {"fps": 30.0, "e2e_ms": {"p50": 30.0, "p95": 40.0, "p99": 45.0, "max": 90.0, "n": 100}}}
    cur = {"pipeline": {"fps": 20.0, "e2e_ms": {"p50": 31.0, "p95": 41.0, "p99": 60.0, "max": 300.0, "n": 100}}}
    assert sorted(r.key for r in compare(cur, base)) == ["pipeline.e2e_ms.p99", "pipeline.fps"]


# A 'stream' suite's result as medrt bench --json gives it (stream_replay's keys).
STREAM: dict[str, Any] = {"stream_30fps": {
    "model": "lesion_unet_lite@4.1.1", "target_fps": 30.0, "frames": 300, "analysed": 300, "fps": 30.0,
    "drops": 0, "late_source_items": 0, "p50_ms": 60.0, "p99_ms": 100.0, "max_ms": 110.0,
    "rss_growth_pct": 0.5, "depth": 2, "workers": 2, "max_in_flight": 4, "errors": 0}}


def _stream(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(STREAM)
    doc["stream_30fps"].update(changes)
    return doc


def test_frames_dropped_failed_or_not_analysed_are_regressions() -> None:
    # the figures all within the tolerance, but 3 of 300 frames dropped where the baseline dropped none
    diff = diff_bench(_stream(drops=3, analysed=297, fps=29.8), STREAM)
    assert not diff.ok
    assert [(r.key, r.baseline, r.current) for r in diff.regressions] == [
        ("stream_30fps.analysed", 300, 297), ("stream_30fps.drops", 0, 3)]
    text = format_regressions(diff)
    assert text.startswith("2 regression(s)") and "stream_30fps.drops: 0 -> 3 (none in the baseline)" in text
    # a frame that failed is never within the tolerance, however wide
    assert [r.key for r in compare(_stream(errors=1), STREAM, tolerance=10)] == ["stream_30fps.errors"]
    assert [r.key for r in compare(_stream(errors=3), _stream(errors=2), tolerance=10)] == ["stream_30fps.errors"]
    # frames lost without a drop or an error counted
    assert [r.key for r in compare(_stream(analysed=290), STREAM)] == ["stream_30fps.analysed"]
    # drops where the baseline had some: judged by the tolerance, like a timing
    some = _stream(drops=10, analysed=290)
    assert compare(_stream(drops=11, analysed=289), some) == []
    assert [r.key for r in compare(_stream(drops=12, analysed=288), some)] == [
        "stream_30fps.analysed", "stream_30fps.drops"]
    assert [r.key for r in diff_bench(_stream(drops=2, analysed=298), some).improvements] == [
        "stream_30fps.analysed", "stream_30fps.drops"]
    assert diff_bench(copy.deepcopy(STREAM), STREAM).checked == 9  # fps, 3 latencies, RSS growth, the 4 counts


def test_memory_is_compared_by_the_tolerance_above_a_floor() -> None:
    """Memory figures were not compared at all: an engine's memory_mb, series_outputs'
    peak_mb and peak_rss_mb, the stream's rss_growth_pct. They are now lower-is-better,
    worse when beyond the tolerance and beyond a floor (MB, or points of a growth in %),
    as a resident set moves by megabytes from run to run whatever the code."""
    assert MEMORY_FLOOR_MB == 16.0 and MEMORY_FLOOR_POINTS == 2.0
    for key in ("memory_mb", "peak_mb", "peak_rss_mb", "rss_max_mb", "rss_growth_pct"):
        assert direction("x", key) == "lower", key
    assert direction("decode.rows[]", "file_mb") is None  # the input's size, not our code
    # 40 -> 60 MB: +50 % and +20 MB; 40 -> 50: +25 % but 10 MB, within the floor
    grown = diff_bench(_changed(["engines", 0, "memory_mb"], 60.0), BASELINE)
    assert [(r.key, r.change) for r in grown.regressions] == [
        ("engines[onnxruntime/cpu/fp32/1024].memory_mb", pytest.approx(0.5))]
    assert "engines[onnxruntime/cpu/fp32/1024].memory_mb: 40 -> 60 (+50.0%, +20 MB)" in format_regressions(grown)
    assert compare(_changed(["engines", 0, "memory_mb"], 50.0), BASELINE) == []
    assert [r.key for r in diff_bench(_changed(["engines", 1, "memory_mb"], 10.0), BASELINE).improvements] == [
        "engines[onnxruntime/cpu/int8/1024].memory_mb"]
    # a large figure: the tolerance decides (142 -> 160 MB is +12.7 %; -> 180, +26.8 %)
    outputs = {"series_outputs": {"frames": 500, "total_ms": 1110.0, "peak_mb": 142.0, "peak_rss_mb": 0.9}}
    assert diff_bench(copy.deepcopy(outputs), outputs).checked == 3
    more = copy.deepcopy(outputs)
    more["series_outputs"].update(peak_mb=160.0, peak_rss_mb=10.7)  # the resident rise: 0.9 -> 10.7 is noise
    assert compare(more, outputs) == []
    more["series_outputs"].update(peak_mb=180.0, peak_rss_mb=40.0)
    assert [r.key for r in compare(more, outputs)] == ["series_outputs.peak_mb", "series_outputs.peak_rss_mb"]
    none = copy.deepcopy(outputs)
    none["series_outputs"]["peak_rss_mb"] = 0.0  # a baseline of 0 MB: the floor alone
    diff = diff_bench(more, none)
    assert [r.key for r in diff.regressions] == ["series_outputs.peak_mb", "series_outputs.peak_rss_mb"]
    assert "series_outputs.peak_rss_mb: 0 -> 40 (+40 MB)" in format_regressions(diff)
    # a growth in percent of the RSS, judged in points: +0.5 % -> +1.9 % is noise, -> +4 % is not
    assert compare(_stream(rss_growth_pct=1.9), STREAM) == []
    assert compare(_stream(rss_growth_pct=-1.0), STREAM) == []
    grew = diff_bench(_stream(rss_growth_pct=4.0), STREAM)
    assert [r.key for r in grew.regressions] == ["stream_30fps.rss_growth_pct"]
    assert "stream_30fps.rss_growth_pct: 0.5 -> 4 (+700.0%, +3.5 points)" in format_regressions(grew)
    assert compare(_stream(rss_growth_pct=30.0), _stream(rss_growth_pct=25.0), tolerance=0.25) == []  # 5 < 6.25
    assert compare(_stream(rss_growth_pct=5.0), STREAM, tolerance=10) == []  # 4.5 points < 10 x 0.5


def test_frames_the_replay_sent_late_are_regressions_like_drops() -> None:
    """late_source_items: frames the 30 fps replay released more than a period late, the
    pipeline pushing back on a live source. Rising is a regression, as drops are."""
    diff = diff_bench(_stream(late_source_items=4), STREAM)
    assert [(r.key, r.baseline, r.current) for r in diff.regressions] == [("stream_30fps.late_source_items", 0, 4)]
    some = _stream(late_source_items=10)
    assert compare(_stream(late_source_items=11), some) == []  # within the tolerance where some were late
    assert [r.key for r in compare(_stream(late_source_items=12), some)] == ["stream_30fps.late_source_items"]
    assert [r.key for r in diff_bench(_stream(late_source_items=2), some).improvements] == [
        "stream_30fps.late_source_items"]


@pytest.mark.parametrize(("key", "value"), [("cores", 16), ("workers", 4), ("depth", 8), ("max_in_flight", 2)])
def test_another_core_count_or_pipeline_layout_is_a_settings_mismatch(key: str, value: int) -> None:
    """Throughput and pipelined/serial ratios measured on 16 cores, or through another
    layout, do not compare with those of 2 cores: not comparable, not "no regressions"."""
    base = copy.deepcopy(STREAM)
    base["stream_30fps"]["cores"] = 2
    cur = copy.deepcopy(base)
    cur["stream_30fps"][key] = value
    diff = diff_bench(cur, base)
    assert not diff.ok and diff.regressions == ()
    assert diff.mismatches == (f"stream_30fps.{key}: {base['stream_30fps'][key]!r} in the baseline, {value!r} now",)
    assert diff_bench(copy.deepcopy(base), base).ok


def test_an_engine_that_fails_where_the_baseline_ran_is_a_failure() -> None:
    """An engine row that errors now has no figures and, as engine_table wrote it before,
    no size: it used to read as one row "in the baseline only" and another "new", and the
    comparison passed."""
    error = "CUDA failure 100: no CUDA-capable device is detected"
    for row in ({"backend": "onnxruntime", "device": "cpu", "precision": "int8", "error": error},  # no size
                {"backend": "onnxruntime", "device": "cpu", "precision": "int8", "size": 1024, "error": error}):
        current = copy.deepcopy(BASELINE)
        current["engines"][1] = row
        diff = diff_bench(current, BASELINE)
        assert not diff.ok and diff.regressions == () and diff.mismatches == ()
        assert diff.failures == (f"engines[onnxruntime/cpu/int8/1024]: ran in the baseline, fails now: {error}",)
        assert not any("onnxruntime/cpu/int8" in n for n in diff.notes), diff.notes
        text = format_regressions(diff)
        assert "failed: 1 result(s) that ran in the baseline fail now:" in text
        assert "no regressions beyond 15%" in text and "but results fail (above)" in text
        # the other way round: it failed in the baseline and runs now, a note
        back = diff_bench(BASELINE, current)
        assert back.ok and back.failures == ()
        assert [n for n in back.notes if "int8" in n] == [
            f"engines[{'onnxruntime/cpu/int8' + ('/1024' if 'size' in row else '')}]: failed in the baseline "
            f"({error}), runs now; nothing to compare it with"]
    # failing in both runs: the error text is compared, as before
    both = copy.deepcopy(BASELINE)
    both["engines"][1] = {"backend": "onnxruntime", "device": "cpu", "precision": "int8", "error": error}
    assert diff_bench(both, copy.deepcopy(both)).ok


def test_a_changed_run_setting_makes_the_comparison_fail_as_incomparable() -> None:
    # the same figures at another target rate: not "no regressions"
    diff = diff_bench(_stream(target_fps=60.0), STREAM)
    assert not diff.ok and diff.regressions == ()
    assert diff.mismatches == ("stream_30fps.target_fps: 30.0 in the baseline, 60.0 now",)
    text = format_regressions(diff)
    assert text.startswith("not comparable: 1 run setting(s) differ from the baseline's")
    assert "no regressions beyond 15% (9 figures compared); but the settings differ (above)" in text
    # so does any other run setting beside the figures
    size = diff_bench(_changed(["roi_vs_full", "size"], 2048), BASELINE)
    assert not size.ok and size.mismatches == ("roi_vs_full.size: 4096 in the baseline, 2048 now",)
    # frames lost are judged per frame sent when --stream-frames changed: 3 of 100 is 9 of 300
    fewer = diff_bench(_stream(frames=100, analysed=97, drops=3), _stream(analysed=291, drops=9))
    assert fewer.regressions == () and fewer.improvements == ()
    assert [r.key for r in diff_bench(_stream(frames=100, analysed=96, drops=4),
                                      _stream(analysed=291, drops=9)).regressions] == [
        "stream_30fps.analysed", "stream_30fps.drops"]


def test_load_bench_json_refuses_a_baseline_of_other_suites(tmp_path: Path) -> None:
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(STREAM))
    assert load_bench_json(base, suites=["stream_30fps", "decode"]) == STREAM
    with pytest.raises(ValueError, match=r"baseline\.json: no result of decode to compare with "
                                         r"\(the baseline holds stream_30fps\)"):
        load_bench_json(base, suites=["decode"])
    base.write_text(json.dumps({"fps": 30}))  # some other tool's JSON
    with pytest.raises(ValueError, match="holds fps"):
        load_bench_json(base, suites=["stream_30fps"])


def test_load_bench_json_says_what_is_wrong(tmp_path: Path) -> None:
    good = tmp_path / "baseline.json"
    good.write_text(json.dumps(BASELINE))
    assert load_bench_json(good) == BASELINE
    with pytest.raises(ValueError, match="no such baseline file"):
        load_bench_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a bench JSON file"):
        load_bench_json(bad)
    with pytest.raises(ValueError, match='"tolerance"'):
        compare(BASELINE, BASELINE, tolerance=-0.1)


def test_graph_suite_times_each_unet_as_loaded_against_its_file() -> None:
    """`medrt bench --only graph`: one row per UNet, the rewritten graph beside the file (no
    timing is asserted: this machine's timings are noisy; the outputs must agree)."""
    from medrt.bench.engine import concat_rewrite

    (row,) = concat_rewrite(models=(("lesion_unet_lite", 128),), repeats=1)
    assert row["model"].startswith("lesion_unet_lite") and row["size"] == 128 and row["concats"] == 8
    assert row["file_ms"] > 0 and row["rewritten_ms"] > 0 and row["speedup"] > 0
    assert row["max_abs_diff"] < 1e-4


def test_listener_suite_sends_a_series_and_times_it_against_batch() -> None:
    """`medrt bench --only listener`: the sample series through the listener and the
    forward, beside `medrt batch` on the same files (figures only; nothing timed)."""
    from medrt.bench.pacs import listener_vs_batch

    row = listener_vs_batch(repeats=1)
    assert row["images"] == 40 and row["repeats"] == 1
    assert row["ingest_images_per_s"] > 0 and row["series_s"] > 0 and row["batch_s"] > 0
    assert row["series_vs_batch"] == pytest.approx(row["series_s"] / row["batch_s"], rel=0.02)
    assert row["lesions_listener"] == row["lesions_batch"] and row["lesions_batch"][0] > 0  # either face, same findings


def test_ray_suite_runs_the_sample_through_ray_and_locally() -> None:
    """`medrt bench --only ray`: the sample folder through a private Ray cluster, one worker
    and a worker per core, beside `medrt batch` (figures only; nothing timed)."""
    from conftest import require_module

    require_module("ray")
    from medrt.bench.cluster import ray_vs_local

    row = ray_vs_local(repeats=1)
    assert (row["series"], row["frames"]) == (4, 43) and row["repeats"] == 1
    assert row["local_s"] > 0 and row["one_worker_s"] > 0 and row["worker_per_core_s"] > 0
    assert 0 < row["one_worker_start_s"] < row["one_worker_s"] and 0 < row["worker_per_core_start_s"]
    assert row["one_worker_vs_local"] == pytest.approx(row["one_worker_s"] / row["local_s"], rel=0.02)
    lesions = row["lesions"]
    assert len(lesions["local"]) == 1 and lesions["local"][0] > 0
    assert lesions["one_worker"] == lesions["worker_per_core"] == lesions["local"]  # same findings every way


def test_series_outputs_suite_times_a_phantom_series_outputs_and_writes_valid_seg_and_sr(tmp_path: Path) -> None:
    """`medrt bench --only series_outputs`: a small CT phantom's outputs, stage by stage; the
    SEG and SR it timed are the real ones (dciodvfy-clean, every lesion a segment, the SR
    naming the SEG). No timing is asserted."""
    import subprocess

    import highdicom as hd

    from conftest import require_tool
    from medrt.bench.outputs import phantom_series, series_outputs

    row = series_outputs(frames=16, repeats=1, cache=tmp_path / "cache", keep=tmp_path / "out")
    assert set(row) == {"frames", "frames_with_lesions", "series_lesions", "link_ms", "seg_ms", "sr_ms",
                        "write_ms", "total_ms", "peak_mb", "peak_rss_mb", "repeats"}
    assert row["frames"] == 16 and row["repeats"] == 1 and row["series_lesions"] > 0 and row["peak_mb"] > 0
    assert all(row[k] > 0 for k in ("link_ms", "seg_ms", "sr_ms", "write_ms"))
    assert row["total_ms"] >= row["link_ms"] + row["seg_ms"] + row["sr_ms"] + row["write_ms"] - 1.0  # the sum of rounded parts
    assert phantom_series(16, cache=tmp_path / "cache") == next((tmp_path / "cache").iterdir())  # cached, reused
    seg_path, sr_path = tmp_path / "out" / "seg.dcm", tmp_path / "out" / "sr.dcm"
    for path in (seg_path, sr_path):
        proc = subprocess.run([require_tool("dciodvfy"), str(path)], capture_output=True, text=True, timeout=120)
        errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln]
        assert not errors, f"dciodvfy {path.name}:\n" + "\n".join(errors)
    seg = hd.seg.segread(seg_path)
    assert len(seg.SegmentSequence) == row["series_lesions"]
    sr = hd.sr.srread(sr_path)
    assert [str(s.ReferencedSOPSequence[0].ReferencedSOPInstanceUID)
            for e in sr.CurrentRequestedProcedureEvidenceSequence for s in e.ReferencedSeriesSequence
            if s.SeriesInstanceUID == seg.SeriesInstanceUID] == [seg.SOPInstanceUID]


def test_a_layer_profile_of_the_files_graph_is_no_baseline_for_one_of_the_rewritten_graph() -> None:
    """A ``--profile-layers`` result saved before ``profile_graph`` was reported profiled the
    model file's graph, whose nodes the rewritten session no longer runs: comparing node times
    across the two is a changed run setting (a mismatch, so ``--compare`` exits 1), not a pass
    with a note. A run without any profile on either side stays as it was."""
    rows = [{"node": "conv1", "op": "Conv", "ms": 1.0}]
    graph = {"model": "lesion_unet_lite@4.1.1", "shape": [64, 64], "threads": 1, "runs": 3, "rewritten": True,
             "rewrites": {"concat_as_sum": ["c1"]}}
    now = {"profile_layers": rows, "profile_graph": graph}
    old = {"profile_layers": rows}
    diff = diff_bench(now, old)
    assert not diff.ok and any("profile_graph.rewritten" in m for m in diff.mismatches), diff.mismatches
    assert diff_bench(now, copy.deepcopy(now)).ok
    # the file's graph profiled now, by name (split_concats=False), against an old profile: alike
    assert diff_bench({**now, "profile_graph": {**graph, "rewritten": False, "rewrites": {}}}, old).ok
    # no profile in the baseline at all: nothing to compare, no mismatch
    plain = diff_bench(now, {"decode": {"rows": []}})
    assert plain.ok and not plain.mismatches


def test_the_listener_memory_suite_waits_for_a_series_whole_not_a_partial_analysis() -> None:
    """On a loaded host a sender can pause for longer than the suite's 0.5 s ``--idle``: the
    listener analyses the images it has, says ``receiving`` (more came meanwhile) or done with
    fewer frames, and analyses the series again once whole. The suite took the first line as
    the series' end and failed ("series 1 did not end done: receiving, 34 frame(s)")."""
    from medrt.bench.pacs import _final_outcome

    uid, other = "1.2.3", "1.2.3.4"
    lines = [f"series {other}: done, 40 frame(s), 9 lesion(s), 0 error(s) in 3.0 s -> x",
             f"series {uid}: receiving, 34 frame(s), 7 lesion(s), 0 error(s) in 4.0 s -> y"]
    assert _final_outcome(lines, uid, 40) is None
    lines.append(f"series {uid}: done, 36 frame(s), 8 lesion(s), 0 error(s) in 3.1 s -> y")
    assert _final_outcome(lines, uid, 40) is None  # analysed before its last images came
    lines.append(f"series {uid}: done, 40 frame(s), 9 lesion(s), 0 error(s) in 3.2 s -> y")
    assert _final_outcome(lines, uid, 40) == lines[-1]
    assert _final_outcome(lines, other, 40) == lines[0]
    failed = f"series {uid}: failed, 40 frame(s), 0 lesion(s), 1 error(s) in 0.1 s -> y"
    assert _final_outcome([*lines, failed], uid, 40) == failed  # an end, to be reported
