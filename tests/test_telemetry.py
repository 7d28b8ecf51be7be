"""Pipeline telemetry: exact percentiles, warm-up, thread safety, counters, memory and files.

Nothing here asserts on real elapsed time: throughput and the status line run on
a fake clock.
"""

from __future__ import annotations

import json
import math
import mmap
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from medrt.bench import percentile
from medrt.pipeline.telemetry import LatencyRecorder, Telemetry, rss_bytes
from medrt.types import StageTimings


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_percentiles_exact_and_warmup_excluded() -> None:
    rec = LatencyRecorder(warmup=5)
    for _ in range(5):
        rec.add(10_000.0)  # warm-up outliers: must not show
    values = [float(v) for v in range(1, 101)]
    for v in values:
        rec.add(v)
    p = rec.percentiles()
    assert rec.count == 100 and p["n"] == 100
    assert p["p50"] == pytest.approx(50.5)
    assert p["p95"] == pytest.approx(95.05)
    assert p["p99"] == pytest.approx(99.01)
    assert p["max"] == 100.0 and p["mean"] == pytest.approx(50.5)
    assert p["p99"] == pytest.approx(percentile(values, 99))  # same rule as the bench


def test_empty_recorder_is_nan() -> None:
    p = LatencyRecorder(warmup=3).percentiles()
    assert p["n"] == 0
    assert all(math.isnan(p[k]) for k in ("p50", "p95", "p99", "max", "mean"))
    rec = LatencyRecorder(warmup=3)
    for v in (1.0, 2.0, 3.0):
        rec.add(v)
    assert rec.count == 0 and rec.percentiles()["n"] == 0  # all three were warm-up


def test_recorder_keeps_the_latest_capacity_samples() -> None:
    rec = LatencyRecorder(warmup=0, capacity=10)
    for v in range(100):
        rec.add(float(v))
    assert rec.count == 100
    assert rec.values() == [float(v) for v in range(90, 100)]
    with pytest.raises(ValueError, match='"capacity"'):
        LatencyRecorder(capacity=0)


def test_concurrent_recording_adds_up() -> None:
    threads, per = 8, 2000
    t = Telemetry(["decode", "segment"], ["in", "out"], warmup=10)
    t.start()
    barrier = threading.Barrier(threads)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(per):
            t.record_stage("decode", float(j))
            t.record_stage("segment", float(j))
            t.count_drop("in")
            t.record_depth("out", j % 4)
            t.record_frame(f"t{i}f{j}", StageTimings(segment=1.0), float(j))
        t.count_error("segment")

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    t.stop()
    s = t.summary()
    total = threads * per
    assert s["frames"] == total and t.frames == total
    assert s["stages_ms"]["decode"]["n"] == total - 10
    assert s["stages_ms"]["segment"]["n"] == total - 10
    assert s["e2e_ms"]["n"] == total - 10
    assert s["edges"]["in"]["drops"] == total and s["drops"] == total
    assert s["edges"]["out"]["depth_max"] == 3 and s["edges"]["out"]["depth_mean"] == pytest.approx(1.5)
    assert s["errors"] == {"decode": 0, "segment": threads}


def test_drops_rejects_errors_and_depths_per_edge_and_stage() -> None:
    t = Telemetry(["decode", "analyze", "export"], ["decode>analyze", "analyze>export"], warmup=0)
    t.count_drop("decode>analyze", 3)
    t.count_drop("decode>analyze")
    t.count_reject("analyze>export", 2)
    t.count_error("analyze")
    t.count_error("analyze")
    for d in (0, 2, 1):
        t.record_depth("decode>analyze", d)
    s = t.summary()
    assert s["edges"]["decode>analyze"] == {"drops": 4, "rejects": 0, "depth_last": 1, "depth_max": 2,
                                            "depth_mean": 1.0}
    assert s["edges"]["analyze>export"]["rejects"] == 2 and s["edges"]["analyze>export"]["depth_mean"] is None
    assert (s["drops"], s["rejects"]) == (4, 2)
    assert s["errors"] == {"decode": 0, "analyze": 2, "export": 0}
    with pytest.raises(KeyError, match="unknown edge 'nope'"):
        t.count_drop("nope")
    with pytest.raises(KeyError, match="unknown stage 'nope'"):
        t.record_stage("nope", 1.0)
    with pytest.raises(ValueError, match="duplicate"):
        Telemetry(["a", "a"])
    with pytest.raises(TypeError, match='"stages"'):
        Telemetry("decode")  # a bare string is not a list of stages


def test_throughput_after_warmup_and_status_line_on_a_fake_clock() -> None:
    clock = FakeClock()
    t = Telemetry(["analyze"], ["in", "mid", "out"], warmup=2, clock=clock)
    t.start()
    assert t.status_line() == "fps - | p99 - ms | drops 0 | queues 0/0/0"
    for i in range(12):  # one frame every 0.1 s
        clock.t += 0.1
        t.record_frame(f"f{i}", {"segment": 5.0}, 40.0 + i)
    # frames 3..12 completed between the 2nd completion (t0+0.2) and the 12th (t0+1.2)
    assert t.throughput_fps() == pytest.approx(10.0)
    t.record_depth("in", 1)
    t.record_depth("mid", 2)
    t.count_drop("in", 2)
    t.count_reject("out")
    line = t.status_line()
    assert re.fullmatch(r"fps \d+\.\d \| p99 \d+ ms \| drops \d+ \| queues \d+/\d+/\d+", line), line
    # 12 completions over the 1.2 s since start (shorter than the 2 s window); p99 of 42..51
    assert line == "fps 10.0 | p99 51 ms | drops 3 | queues 1/2/0"
    clock.t += 10.0  # nothing finished in the last 2 s
    assert t.status_line().startswith("fps 0.0 |")


def test_throughput_is_nan_before_warmup_is_over() -> None:
    clock = FakeClock()
    t = Telemetry(["a"], warmup=5, clock=clock)
    for i in range(5):
        clock.t += 1.0
        t.record_frame(str(i), {}, 1.0)
    assert math.isnan(t.throughput_fps())
    assert t.summary()["fps"] is None


def test_dropped_frames_are_logged_but_not_timed() -> None:
    t = Telemetry(["a"], warmup=0)
    t.record_frame("kept", {"segment": 3.0}, 10.0)
    t.record_frame("lost", {}, 999.0, dropped=True)
    s = t.summary()
    assert (s["frames"], s["frames_dropped"], s["e2e_ms"]["n"]) == (1, 1, 1)
    assert s["e2e_ms"]["max"] == 10.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc/self/statm is Linux only")
def test_memory_samples_rss_and_growth_without_importing_torch() -> None:
    had_torch = "torch" in sys.modules
    rss, source = rss_bytes()
    assert rss is not None and rss > 10 * 2**20 and source == "statm"  # a Python with numpy: > 10 MB
    t = Telemetry(["a"], warmup=1)
    t.start()  # samples; no frame done yet, so not the after-warm-up baseline
    t.record_frame("f0", {}, 1.0)
    s1 = t.sample_memory()  # the baseline after warm-up
    assert s1.rss is not None and s1.rss > 0
    assert math.isnan(t.rss_growth())  # one sample after warm-up: nothing to compare
    # 64 MB of fresh anonymous pages, touched (a numpy array could reuse pages the
    # allocator kept resident from earlier tests, and then RSS would not grow)
    ballast = mmap.mmap(-1, 64 * 2**20)
    ballast.write(b"\x01" * (64 * 2**20))
    t.stop()
    m = t.summary()["memory"]
    assert m["rss_first_mb"] > 0 and m["rss_max_mb"] >= m["rss_last_mb"] >= m["rss_after_warmup_mb"] + 50
    assert t.rss_growth() > 0 and m["rss_growth_pct"] == pytest.approx(t.rss_growth(), abs=0.01)
    assert ("torch" in sys.modules) == had_torch, "sample_memory must not import torch"
    ballast.close()


def test_jsonl_has_one_line_per_frame_then_the_summary(tmp_path: Path) -> None:
    t = Telemetry(["decode", "analyze"], ["q"], warmup=1)
    t.start()
    for i in range(4):
        t.record_stage("analyze", 10.0 + i)
        t.record_frame(f"1.2.3.{i}", StageTimings(decode=1.0, segment=20.0 + i, total=25.0), 30.0 + i)
    t.record_frame("1.2.3.9", {}, 0.0, dropped=True)
    t.stop()
    out = t.write_jsonl(tmp_path / "run" / "frames.jsonl")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6 and list(tmp_path.joinpath("run").iterdir()) == [out]  # no temp file left
    assert [r["key"] for r in lines[:5]] == ["1.2.3.0", "1.2.3.1", "1.2.3.2", "1.2.3.3", "1.2.3.9"]
    assert lines[1]["timings_ms"]["segment"] == 21.0 and lines[1]["e2e_ms"] == 31.0
    assert lines[4]["dropped"] is True and "dropped" not in lines[0]
    assert all(r["t_s"] >= 0 for r in lines[:5])
    summary = lines[-1]["summary"]
    assert summary["frames"] == 4 and summary["e2e_ms"]["n"] == 3
    assert summary["stages_ms"]["decode"]["p50"] is None  # no samples: null, not NaN
    assert summary["timings_ms"]["segment"]["p50"] == 22.0  # frames 2..4 after warm-up
    json.dumps(t.summary(), allow_nan=False)
    table = t.summary_table()
    assert "end to end" in table and "stage analyze" in table and "step segment" in table
    assert "step recheck" not in table  # a step that never ran is left out of the table


def test_histogram_png_opens_with_the_expected_size(tmp_path: Path) -> None:
    from PIL import Image

    t = Telemetry(["analyze"], warmup=0)
    rng = np.random.default_rng(0)
    for i, v in enumerate(rng.gamma(9.0, 4.0, size=300)):
        t.record_stage("analyze", float(v))
        t.record_frame(str(i), {"segment": float(v) / 2}, float(v))
    for stage in ("e2e", "analyze", "segment"):
        path = t.histogram_png(tmp_path / f"{stage}.png", stage=stage, size=(640, 360))
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size == (640, 360)
            colours = img.convert("RGB").getcolors(maxcolors=1 << 16) or []
            assert len(colours) > 3  # bars, axes and text were drawn, not a blank page
    empty = Telemetry(["a"]).histogram_png(tmp_path / "empty.png")
    with Image.open(empty) as img:
        assert img.size == (800, 480)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["analyze.png", "e2e.png", "empty.png", "segment.png"]
    with pytest.raises(KeyError, match="no latency named 'nope'"):
        t.histogram_png(tmp_path / "x.png", stage="nope")
