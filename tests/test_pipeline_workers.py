"""Worker processes (medrt.pipeline.workers) and shared-memory results (medrt.pipeline.shm).

Tasks are stdlib callables (``eval`` of a short expression, ``os._exit``) so the
forkserver workers need not import this test module.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from medrt.errors import CorruptPixelDataError
from medrt.pipeline.shm import Packed, ParentSlots, WorkerSlots
from medrt.pipeline.workers import WorkerPool, WorkerStartError

CT = Path(__file__).resolve().parents[1] / "sample_dicom" / "ct_stream"
SHM = Path("/dev/shm")


def _shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def test_results_exceptions_and_restart_after_close():
    pool = WorkerPool(2)
    try:
        assert pool.call(eval, "6 * 7", "a.dcm") == 42
        with pytest.raises(ZeroDivisionError):  # the worker's exception, raised here
            pool.call(eval, "1 / 0", "b.dcm")
        pids = {w.process.pid for w in pool._workers}
        pool.close()
        assert not pool.running and not any(p == os.getpid() for p in pids)
        assert pool.call(eval, "1 + 1", "c.dcm") == 2  # a later call starts new workers
        assert {w.process.pid for w in pool._workers}.isdisjoint(pids)
    finally:
        pool.close()


def test_a_worker_logs_as_the_parent_does_with_header_values_redacted():
    """A worker process had no logging set up: pydicom's warnings came out raw on stderr,
    a quoted header value (a patient's name) and a source line with them, even with
    --quiet. It now logs as the command line does: redacted, at the parent's level.
    (What the worker's log handler writes is caught in the worker: a forkserver started
    by an earlier test writes to the stderr it had then, which capfd does not see.)"""
    import logging

    caught = (
        "(lambda io, logging, warnings, sys: (lambda buf, h: ("
        "h.setStream(buf), "
        "logging.getLogger('pydicom').warning(\"Invalid value for VR PN: 'DOE^JOHN'\"), "
        "warnings.warn(\"odd value 'DOE^JANE'\"), "
        "h.setStream(sys.stderr), buf.getvalue())[-1])(io.StringIO(), logging.getLogger().handlers[0]))"
        "(__import__('io'), __import__('logging'), __import__('warnings'), __import__('sys'))"
    )
    root = logging.getLogger()
    level = root.level
    pool = WorkerPool(1)
    try:
        root.setLevel(logging.WARNING)
        said = pool.call(eval, caught, "a.dcm")
        root.setLevel(logging.ERROR)  # --quiet: a new worker logs errors only
        pool.close()
        quiet = pool.call(eval, caught, "b.dcm")
    finally:
        pool.close()
        root.setLevel(level)
    assert "DOE^" not in said, said
    assert said.count("WARNING pydicom: Invalid value for VR PN: '…'") == 1, said
    assert said.count("odd value '…'") == 1, said
    assert quiet == ""


def test_a_crash_blames_only_the_task_that_was_running():
    """One worker, two pipes: the first task kills the worker while the second waits
    behind it. The first is reported as crashing; the second runs on the replacement."""
    pool = WorkerPool(1, channels=2)
    pool.start()
    out: dict[str, object] = {}

    def ask(name: str, expr: str) -> None:
        try:
            out[name] = pool.call(eval, expr, name)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertions
            out[name] = exc

    try:
        crash = threading.Thread(target=ask, args=("bad.dcm", "__import__('time').sleep(0.5) or __import__('os')._exit(3)"))
        crash.start()
        time.sleep(0.2)  # the crashing task is running; this one waits in the second pipe
        ask("good.dcm", "__import__('os').getpid()")
        crash.join(30)
        assert isinstance(out["bad.dcm"], CorruptPixelDataError) and "bad.dcm" in str(out["bad.dcm"])
        assert out["good.dcm"] == pool._workers[0].process.pid  # answered by the replacement
    finally:
        pool.close()


def test_a_worker_that_cannot_start_raises_at_start():
    import operator

    pool = WorkerPool(1, operator.truediv, (1, 0))
    with pytest.raises(WorkerStartError, match="ZeroDivisionError"):
        pool.start()
    assert not pool.running


def test_close_waits_for_a_task_in_flight():
    pool = WorkerPool(1, channels=1)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(pool.call(eval, "__import__('time').sleep(0.4) or 'done'", "x")))
    pool.start()
    t.start()
    time.sleep(0.1)
    pool.close(timeout=30)
    t.join(5)
    assert got == ["done"] and not pool.running


@pytest.fixture(scope="module")
def results():
    from medrt.analyzer import load_analyzer
    from medrt.io.dicom import read_frames

    analyzer = load_analyzer(seg_model="lesion_unet_lite", threads=1)
    return [analyzer.analyze(read_frames(p)[0]) for p in sorted(CT.glob("*.dcm"))[12:16]]


def test_shared_memory_round_trip_and_cleanup(results):
    before = _shm_names()
    worker, parent = WorkerSlots(count=2), ParentSlots()
    try:
        a, b = worker.pack([results[0]]), worker.pack(results[1:3])
        assert isinstance(a, Packed) and isinstance(b, Packed) and a.name != b.name
        # Both slots busy until the parent copies them out: the next result goes pickled.
        assert worker.pack([results[3]]) == [results[3]]
        for packed, want in ((a, results[:1]), (b, results[1:3])):
            got = parent.unpack(packed)
            for x, y in zip(want, got, strict=True):
                assert np.array_equal(x.frame.pixels, y.frame.pixels) and x.frame.pixels.dtype == y.frame.pixels.dtype
                assert np.array_equal(x.labels, y.labels) and x.labels.dtype == y.labels.dtype
                assert x.lesions == y.lesions and x.frame.key == y.frame.key
        assert isinstance(worker.pack([results[3]]), Packed)  # a slot is free again
        assert parent.unpack(worker.pack([results[3]]))[0].frame.key == results[3].frame.key
    finally:
        worker.close()
        parent.close()
    assert _shm_names() == before


def test_small_large_and_colour_arrays(results):
    r = results[0]
    worker, parent = WorkerSlots(count=1, cap_bytes=4 << 20), ParentSlots()
    try:
        tiny = replace(r, frame=replace(r.frame, pixels=r.frame.pixels[:8, :8]), labels=r.labels[:8, :8])
        assert worker.pack([tiny]) == [tiny]  # below the threshold: pickled
        assert worker.pack([r, r, r]) == [r, r, r]  # 4.5 MB past the 4 MB cap: pickled
        colour = np.arange(512 * 512 * 3, dtype=np.uint8).reshape(512, 512, 3)
        rc = replace(r, frame=replace(r.frame, color=colour))
        got = parent.unpack(worker.pack([rc]))[0]
        assert np.array_equal(got.frame.color, colour) and np.array_equal(got.frame.pixels, r.frame.pixels)
    finally:
        worker.close()
        parent.close()


def test_an_analysis_process_sizes_its_band_pool_to_its_share_of_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ProcessAnalysis worker runs on one core (its ORT session gets one thread), and
    so does its band pool for large frames; a setting made by the user is kept."""
    from medrt import bands
    from medrt.analyzer import AnalyzerConfig
    from medrt.pipeline import stages

    config = AnalyzerConfig(seg_model="lesion_unet_lite", roi_model="roi_classifier", warmup_shapes=((64, 64),),
                            threads=1)
    monkeypatch.delenv("MEDRT_BAND_THREADS", raising=False)
    monkeypatch.setattr(stages, "_WORKER", {})
    stages._start_worker(config, None, None)
    assert bands.threads() == 1
    monkeypatch.setenv("MEDRT_BAND_THREADS", "3")
    stages._start_worker(config, None, None)
    assert bands.threads() == 3
