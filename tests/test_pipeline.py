"""The staged pipeline: queue policies, order, errors, shutdown, and the real analysis stages."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from medrt.io.sources import FileReplay, FolderWatch, Lookahead, QueueSource
from medrt.pipeline.graph import Envelope, FrameError, Pipeline, Stage, rule_depth, run_serial
from medrt.pipeline.queues import END, BoundedQueue, Policy, QueueClosed

# -- queues -------------------------------------------------------------------------


def test_latest_drops_the_oldest():
    dropped = []
    q = BoundedQueue("e", 2, Policy.LATEST, dropped.append)
    for i in range(5):
        assert q.put(i)
    assert [q.get(), q.get()] == [3, 4]
    assert dropped == [0, 1, 2] and q.drops == 3


def test_reject_counts_and_refuses_new():
    refused = []
    q = BoundedQueue("e", 2, Policy.REJECT, refused.append)
    assert [q.put(i) for i in range(5)] == [True, True, False, False, False]
    assert [q.get(), q.get()] == [0, 1]
    assert refused == [2, 3, 4] and q.rejects == 3


def test_block_never_drops_and_waits_for_room():
    q = BoundedQueue("e", 1, Policy.BLOCK)
    q.put(0)
    assert q.put(1, timeout=0.05) is False  # full: waited and gave up, nothing dropped
    got = []

    def consume():
        for _ in range(20):
            got.append(q.get(timeout=5))

    t = threading.Thread(target=consume)
    t.start()
    for i in range(1, 20):
        assert q.put(i, timeout=5)
    t.join(5)
    assert got == list(range(20)) and q.drops == 0 and q.rejects == 0


def test_end_sentinel_is_never_dropped_and_closed_queue_raises():
    q = BoundedQueue("e", 1, Policy.LATEST)
    q.put(1)
    q.put(END)
    q.put(2)  # drops 1, keeps END
    assert q.get() is END and q.get() == 2
    q.close()
    with pytest.raises(QueueClosed):
        q.get(timeout=1)
    with pytest.raises(QueueClosed):
        q.put(3)


def test_policy_names_are_checked():
    with pytest.raises(ValueError, match="policy"):
        BoundedQueue("e", 1, "drop-everything")
    with pytest.raises(ValueError, match="maxsize"):
        BoundedQueue("e", 0)


def test_rule_depth_is_the_seed_rule():
    assert rule_depth(10, 10) == 2
    assert rule_depth(5, 50) == 2
    assert rule_depth(0, 50) == 2
    assert rule_depth(30, 30) == 2
    assert rule_depth(100, 1) == 2  # (101)/100 rounds up to 2


# -- pipeline -----------------------------------------------------------------------


class Collect:
    def __init__(self):
        self.results, self.errors, self.closed = [], [], False

    def on_result(self, payload, env: Envelope):
        self.results.append(payload)

    def on_error(self, error: FrameError, env: Envelope):
        self.errors.append(error)

    def close(self):
        self.closed = True


def _jitter(x):
    time.sleep(0.001 * ((x * 7) % 5))
    return x


def test_results_stay_in_source_order_with_several_workers():
    sink = Collect()
    stages = [Stage("a", _jitter, workers=3), Stage("b", lambda x: x * 10, workers=2)]
    p = Pipeline(range(60), stages, [sink], depth=4)
    assert p.run(timeout=30)
    assert sink.results == [x * 10 for x in range(60)] and sink.closed


def test_fan_out_keeps_order_and_empty_outputs_leave_no_hole():
    sink = Collect()
    stages = [Stage("split", lambda n: [f"{n}.{i}" for i in range(n % 3)], workers=2, fan_out=True),
              Stage("up", str.upper, workers=2)]
    assert Pipeline(range(30), stages, [sink], depth=2).run(timeout=30)
    assert sink.results == [f"{n}.{i}" for n in range(30) for i in range(n % 3)]


def test_an_exception_is_reported_with_its_item_and_the_pipeline_goes_on():
    def fragile(x):
        if x % 4 == 1:
            raise ValueError(f"bad item {x}")
        return x

    sink = Collect()
    p = Pipeline(range(12), [Stage("fragile", fragile, workers=2), Stage("next", lambda x: x + 100)], [sink])
    assert p.run(timeout=30)
    assert sink.results == [x + 100 for x in range(12) if x % 4 != 1]
    assert [e.key for e in sink.errors] == ["1", "5", "9"]
    assert all(e.stage == "fragile" and "bad item" in e.reason for e in sink.errors)


def test_a_finished_pipeline_and_what_its_sinks_hold_are_freed_without_the_cyclic_gc():
    """A finished pipeline is freed by reference counting, with its sinks and what they
    hold (a batch's frames, masks and headers), errors included. A discard callback bound
    to the pipeline (pipeline -> queue -> method -> pipeline) and a stage error kept with
    its traceback (error -> frame of the stage's loop -> pipeline) made cycles that lived
    until a full collection: in the listener, ~12 MB more per 40-slice series for several
    series. The collector is off here, so only reference counting frees anything."""
    import gc
    import weakref

    def fragile(x):
        if x == 3:
            raise ValueError("bad item")
        return x

    enabled = gc.isenabled()
    gc.disable()
    try:
        sink = Collect()
        p = Pipeline(range(8), [Stage("fragile", fragile, workers=2), Stage("next", lambda x: x)], [sink])
        assert p.run(timeout=30)
        (error,) = sink.errors
        gone = [weakref.ref(p), weakref.ref(sink)]
        del p, sink
        assert [ref() for ref in gone] == [None, None]
        assert "bad item" in error.reason and error.error.__traceback__ is None  # the reason stays, not the frames
    finally:
        if enabled:
            gc.enable()


def test_an_input_error_is_logged_naming_its_file_once(caplog):
    """The warning line names the item (its file) once; the error's own message, which
    names the file too, is not repeated in it."""
    from medrt.errors import NoPixelDataError

    def decode(path):
        raise NoPixelDataError(path, "CT Image Storage has no (7FE0,0010) Pixel Data")

    sink = Collect()
    with caplog.at_level("WARNING", logger="medrt.pipeline.graph"):
        assert Pipeline(["/data/a.dcm"], [Stage("decode", decode)], [sink]).run(timeout=30)
    (line,) = [r.getMessage() for r in caplog.records if "failed on" in r.getMessage()]
    assert line.count("/data/a.dcm") == 1 and "NoPixelDataError: no pixel data: CT Image Storage" in line
    assert "/data/a.dcm" in sink.errors[0].reason  # the report's reason keeps the whole message


def test_a_broken_sink_does_not_stop_the_pipeline():
    class Broken(Collect):
        def on_result(self, payload, env):
            raise RuntimeError("disk full")

    good = Collect()
    p = Pipeline(range(10), [Stage("id", lambda x: x)], [Broken(), good])
    assert p.run(timeout=30)
    assert good.results == list(range(10)) and p.sink_errors == 10


def test_latest_policy_drops_under_load_but_keeps_up_and_stays_ordered():
    sink = Collect()
    slow = Stage("slow", lambda x: (time.sleep(0.01), x)[1])
    p = Pipeline(FileReplay([Path(f"f{i}") for i in range(200)], fps=1000), [slow], [sink],
                 policy=Policy.LATEST, depth=2)
    assert p.run(timeout=60)
    counters = p.counters()
    drops = sum(c["drops"] for c in counters.values())
    keys = [str(r) for r in sink.results]
    assert drops > 0 and len(keys) + drops == 200
    assert keys == sorted(keys, key=lambda k: int(k[1:]))  # in order, with gaps
    assert keys[-1] == "f199"  # the newest frame was kept


class InFlight:
    """Counts items between the first stage's start and the sink: the most at once."""

    def __init__(self):
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def enter(self, x):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        return x

    def leave(self):
        with self.lock:
            self.now -= 1


def _live(bound):
    """A 1000 fps replay into a pipeline that runs ~200 fps, latest-wins at the entry."""
    meter = InFlight()

    class Leave(Collect):
        def on_result(self, payload, env):
            meter.leave()
            super().on_result(payload, env)

    sink = Leave()
    stages = [Stage("decode", meter.enter), Stage("pre", lambda x: x),
              Stage("infer", lambda x: (time.sleep(0.005), x)[1], workers=2), Stage("post", lambda x: x)]
    p = Pipeline(FileReplay([Path(f"f{i}") for i in range(150)], fps=1000), stages, [sink],
                 policy={"decode": "latest"}, depth=2, max_in_flight=bound, telemetry=True)
    assert p.run(timeout=60)
    return p, sink, meter


def test_max_in_flight_keeps_the_backlog_at_the_entry_where_latest_drops_it():
    """Unbounded, the blocking inner queues fill with stale frames (here 8 and more at
    once); bounded, no more than the bound are ever past the entry, the rest wait there
    and latest-wins drops the oldest: a live view stays near the newest frame."""
    p, sink, meter = _live(None)
    assert meter.most > 4
    p, sink, meter = _live(3)
    assert meter.most <= 3 and p.in_flight == 0
    drops = p.counters()["decode"]["drops"]
    keys = [str(r) for r in sink.results]
    assert drops > 0 and len(keys) + drops == 150 and p.counters()["infer"]["drops"] == 0
    summary = p.telemetry.summary()  # the summary's frame count agrees with the queue's
    assert summary["frames_dropped"] == drops == summary["edges"]["decode"]["drops"]
    assert summary["frames"] == len(keys)
    assert keys == sorted(keys, key=lambda k: int(k[1:])) and keys[-1] == "f149"


def test_max_in_flight_frees_a_credit_for_errors_empty_fan_outs_and_gaps():
    """Every way an item can end (a result, an error, a fan-out with no output, several
    outputs) gives its credit back: with one credit, one leak would stall the run."""
    def fragile(x):
        if x.endswith(".0") and int(x.split(".")[0]) % 4 == 1:
            raise ValueError(f"bad {x}")
        return x

    sink = Collect()
    stages = [Stage("split", lambda n: [f"{n}.{i}" for i in range(n % 3)], workers=2, fan_out=True),
              Stage("fragile", fragile, workers=2)]
    p = Pipeline(range(40), stages, [sink], depth=2, max_in_flight=1)
    assert p.run(timeout=30)
    want = [f"{n}.{i}" for n in range(40) for i in range(n % 3)]
    assert sink.results == [k for k in want if not (k.endswith(".0") and int(k.split(".")[0]) % 4 == 1)]
    assert [e.key for e in sink.errors] == ["1.0", "5.0", "13.0", "17.0", "25.0", "29.0", "37.0"]
    assert p.in_flight == 0
    with pytest.raises(ValueError, match="max_in_flight"):
        Pipeline(range(3), stages, max_in_flight=0)


def test_an_abort_does_not_wait_on_a_credit():
    release = threading.Event()
    src = QueueSource()
    p = Pipeline(src, [Stage("stuck", lambda x: release.wait(30), workers=2)], [Collect()], max_in_flight=1).start()
    src.put_many([1, 2, 3])
    time.sleep(0.1)  # one item holds the credit, the other worker waits for it
    t0 = time.monotonic()
    p.abort(timeout=2)
    stuck = [t for t in p._threads if "stuck" in t.name]
    assert time.monotonic() - t0 < 5 and sum(t.is_alive() for t in stuck) == 1  # only the one inside the stage
    release.set()


def test_reject_policy_counts_what_it_refuses():
    sink = Collect()
    p = Pipeline(FileReplay([Path(f"f{i}") for i in range(100)], fps=0), [Stage("slow", lambda x: (time.sleep(0.005), x)[1])],
                 [sink], policy={"slow": "reject"}, depth=1)
    assert p.run(timeout=60)
    rejects = p.counters()["slow"]["rejects"]
    assert rejects > 0 and len(sink.results) + rejects == 100
    assert str(sink.results[0]) == "f0"


def test_block_policy_never_drops():
    sink = Collect()
    p = Pipeline(FileReplay([Path(f"f{i}") for i in range(50)], fps=0),
                 [Stage("slow", lambda x: (time.sleep(0.002), x)[1], workers=2)], [sink], policy="block", depth=1)
    assert p.run(timeout=60)
    assert len(sink.results) == 50 and all(c["drops"] == 0 and c["rejects"] == 0 for c in p.counters().values())


def test_shutdown_completes_within_its_deadline():
    src = QueueSource()
    sink = Collect()
    p = Pipeline(src, [Stage("id", lambda x: x, workers=2)], [sink]).start()
    src.put_many([1, 2, 3])
    t0 = time.monotonic()
    assert p.stop(timeout=5)
    assert time.monotonic() - t0 < 5
    assert sink.results == [1, 2, 3] and sink.closed


def test_stuck_stage_is_abandoned_at_the_deadline():
    release = threading.Event()
    p = Pipeline(QueueSource(), [Stage("stuck", lambda x: release.wait(30))], [Collect()]).start()
    p.source.put(1)
    time.sleep(0.05)
    t0 = time.monotonic()
    assert p.stop(timeout=0.3) is False
    assert time.monotonic() - t0 < 5
    release.set()


def test_stage_names_and_edges_are_validated():
    with pytest.raises(ValueError, match="unique"):
        Pipeline([], [Stage("a", abs), Stage("a", abs)])
    with pytest.raises(ValueError, match="unknown edges"):
        Pipeline([], [Stage("a", abs)], policy={"nope": "block"})
    with pytest.raises(ValueError, match="workers"):
        Stage("a", abs, workers=0)


def test_run_serial_matches_pipeline():
    stages = [Stage("split", lambda n: [n, -n], fan_out=True), Stage("sq", lambda x: x * x)]
    a, b = Collect(), Collect()
    stats = run_serial(range(10), stages, [a])
    assert Pipeline(range(10), stages, [b]).run(timeout=30)
    assert a.results == b.results and stats.results == 20


# -- sources --------------------------------------------------------------------------


def test_file_replay_paces_and_loops(tmp_path):
    paths = [tmp_path / f"{i}.dcm" for i in range(3)]
    replay = FileReplay(paths, fps=200, loop=2)
    t0 = time.perf_counter()
    got = list(replay)
    assert got == paths * 2 and len(replay) == 6
    assert time.perf_counter() - t0 >= 5 / 200 * 0.9  # the 6th item was due 5 periods after the first
    with pytest.raises(ValueError, match="fps"):
        FileReplay(paths, fps=-1)


def test_folder_watch_waits_for_complete_files(tmp_path):
    (tmp_path / "old.dcm").write_bytes(b"x" * 10)
    watch = FolderWatch(tmp_path, poll=0.02, settle=0.1, idle_timeout=1.0)
    got: list[Path] = []
    t = threading.Thread(target=lambda: got.extend(watch))
    t.start()
    part = tmp_path / "new.dcm.part"
    part.write_bytes(b"y" * 5)  # still being written: ignored
    time.sleep(0.2)
    assert tmp_path / "new.dcm" not in got
    part.rename(tmp_path / "new.dcm")
    t.join(10)
    assert not t.is_alive()
    assert got == [tmp_path / "old.dcm", tmp_path / "new.dcm"]


def test_folder_watch_gives_files_that_complete_together_in_the_order_they_landed(tmp_path):
    """A listener that names files by SOP Instance UID: name order is not slice order, the
    order they were written in is (a 2.5-D model's live neighbours are looked for among
    the files around each one). Files there before the watch began (copied in: their
    times say nothing) go first, by name, as before."""
    import os

    watched = tmp_path / "watched"
    watched.mkdir()
    t0 = 1_700_000_000_000_000_000
    for i, name in enumerate(["b.dcm", "a.dcm"]):  # the backlog, written b then a
        (watched / name).write_bytes(b"x" * 10)
        os.utime(watched / name, ns=(t0 + i * 1_000_000,) * 2)
    staging = tmp_path / "staging"
    staging.mkdir()
    names = ["CT.1.2.9", "CT.1.2.10", "CT.1.2.1", "CT.1.2.5"]  # landed in this order
    for i, name in enumerate(names):
        (staging / name).write_bytes(b"x" * 10)
        os.utime(staging / name, ns=(t0 + i * 1_000_000,) * 2)
    (staging / "CT.1.2.0").write_bytes(b"x")  # the same time as CT.1.2.5: then by name
    os.utime(staging / "CT.1.2.0", ns=(t0 + 3 * 1_000_000,) * 2)
    watch = FolderWatch(watched, poll=0.02, settle=0.1, idle_timeout=1.0)
    got: list[Path] = []
    t = threading.Thread(target=lambda: got.extend(watch))
    t.start()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.rename(staging, watched / "incoming")  # all five land at once
    t.join(10)
    assert not t.is_alive()
    assert [p.name for p in got] == ["a.dcm", "b.dcm", "CT.1.2.9", "CT.1.2.10", "CT.1.2.1", "CT.1.2.0", "CT.1.2.5"]


def test_folder_watch_reads_a_file_again_when_it_changes_after_it_was_read(tmp_path):
    """A sender that stalls longer than ``settle`` mid-write: the half file is yielded (and
    fails to decode downstream); once the rest lands it must be yielded again, not lost.
    A file that does not change is yielded once."""
    watch = FolderWatch(tmp_path, poll=0.02, settle=0.1, idle_timeout=1.5)
    got: list[Path] = []
    t = threading.Thread(target=lambda: got.extend(watch))
    t.start()
    (tmp_path / "same.dcm").write_bytes(b"s" * 10)
    slow = tmp_path / "slow.dcm"
    slow.write_bytes(b"x" * 10)  # the first half, then a stall
    deadline = time.monotonic() + 10
    while slow not in got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow in got
    with slow.open("ab") as f:
        f.write(b"y" * 10)  # the rest
    t.join(15)
    assert not t.is_alive()
    assert got.count(slow) == 2 and got.count(tmp_path / "same.dcm") == 1


def test_folder_watch_close_ends_iteration(tmp_path):
    watch = FolderWatch(tmp_path, poll=0.02)
    t = threading.Thread(target=lambda: list(watch))
    t.start()
    watch.close()
    t.join(5)
    assert not t.is_alive()


def test_queue_source_ends_after_close():
    src = QueueSource()
    src.put_many(["a", "b"])
    src.close()
    assert list(src) == ["a", "b"]
    with pytest.raises(RuntimeError):
        src.put("c")


def test_lookahead_lets_each_item_go_when_the_next_arrives():
    """Each item is held until its successor arrives (then following() names it), or until the
    wait runs out, or the source ends; arrival() gives when each really came."""
    src = QueueSource()
    ahead = Lookahead(src, wait=1.0)
    got: list[tuple[str, float]] = []
    t = threading.Thread(target=lambda: got.extend((x, time.perf_counter()) for x in ahead))
    t.start()
    t_a = time.perf_counter()
    src.put("a")
    time.sleep(0.05)
    assert got == []  # "a" waits for what comes after it
    src.put("b")
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:  # "b" goes alone once the wait is over
        time.sleep(0.01)
    assert [x for x, _ in got] == ["a", "b"]
    assert ahead.following("a") == ["b"] and ahead.following("a") == []  # told once
    assert ahead.following("b") == []  # nothing came after it in time
    assert got[1][1] - ahead.arrival("b") >= 0.9  # held for the wait, and the pipeline is told so
    assert t_a <= ahead.arrival("a") <= got[0][1]
    src.put("c")
    src.put("d")
    src.close()  # the end lets the last one go
    t.join(5)
    assert not t.is_alive() and [x for x, _ in got] == ["a", "b", "c", "d"]
    assert ahead.following("c") == ["d"] and ahead.following("d") == []
    with pytest.raises(ValueError, match="wait"):
        Lookahead(src, wait=0)


def test_a_deeper_lookahead_holds_each_item_for_the_next_few():
    """depth n: each item goes when n more have arrived (a thin-slice series, whose
    neighbours a model learnt some mm away, needs several); want() changes it from the
    next item on, within 1..MAX_DEPTH; a pause lets everything held go."""
    src = QueueSource()
    ahead = Lookahead(src, wait=1.0, depth=2)
    it = iter(ahead)
    for x in "abc":
        src.put(x)
    assert next(it) == "a" and ahead.following("a") == ["b", "c"]
    ahead.want(3)
    for x in "def":
        src.put(x)
    assert next(it) == "b" and ahead.following("b") == ["c", "d", "e"]  # held for three now
    assert next(it) == "c" and ahead.following("c") == ["d", "e", "f"]
    t0 = time.perf_counter()
    assert [next(it), next(it), next(it)] == ["d", "e", "f"]  # nothing more came: all go after the wait
    assert time.perf_counter() - t0 >= 0.9
    assert ahead.following("d") == ["e", "f"] and ahead.following("f") == []
    ahead.want(99)
    assert ahead.depth == Lookahead.MAX_DEPTH
    src.close()
    assert list(it) == []
    with pytest.raises(ValueError, match="depth"):
        Lookahead(src, depth=-1)


def test_a_lookahead_of_depth_0_lets_items_through_until_asked():
    """Depth 0 (a watched folder's default): nothing is held until a 2.5-D model's decode
    stage asks for the next slices with want()."""
    src = QueueSource()
    ahead = Lookahead(src, wait=5.0, depth=0)
    it = iter(ahead)
    src.put("a")
    assert next(it) == "a" and ahead.following("a") == []  # at once, not after the wait
    ahead.want(1)
    src.put("b")
    src.put("c")
    assert next(it) == "b" and ahead.following("b") == ["c"]
    ahead.want(0)
    assert next(it) == "c" and ahead.following("c") == []  # let go at once after the change
    src.put("d")
    assert next(it) == "d"
    src.close()
    assert list(it) == []


def test_a_lookahead_source_counts_its_wait_in_the_latency():
    src = QueueSource()
    ahead = Lookahead(src, wait=0.2)
    got = []

    class Sink:
        def on_result(self, result, env):
            got.append(env)

        def on_error(self, error, env):
            pass

    pipe = Pipeline(ahead, [Stage("same", lambda x: x)], [Sink()], telemetry=True)
    pipe.start()
    t_put = time.perf_counter()
    src.put("only")
    time.sleep(0.05)
    t_release = time.perf_counter()
    src.close()  # lets it go (the wait is longer)
    assert pipe.join(5)
    (env,) = got
    assert t_put <= env.t_arrival < t_release  # from when it arrived, not from when it was let go


# -- sinks ---------------------------------------------------------------------------


def test_ring_buffer_keeps_the_newest_and_never_waits():
    from medrt.pipeline.sinks import CallbackSink, RingBuffer

    ring = RingBuffer(capacity=3)
    got = []
    p = Pipeline(range(10), [Stage("id", lambda x: x)], [ring, CallbackSink(got.append)])
    assert p.run(timeout=30)
    assert ring.drain() == [7, 8, 9] and ring.received == 10 and ring.overwritten == 7
    assert got == list(range(10)) and ring.closed and ring.wait(0.01)
    assert ring.latest() is None


def test_objects_older_than_the_stream_stay_out_of_the_gc_while_it_runs():
    """A full collection over everything a process holds stalled the viewer for 370 ms;
    while pipelines run, what existed before them is frozen, and the last one to end
    unfreezes it. Nested pipelines count; freeze_gc=False leaves the collector alone."""
    import gc

    from medrt.pipeline import gcfreeze

    assert gcfreeze.holders() == 0 and gc.get_freeze_count() == 0
    gates = [threading.Event(), threading.Event()]

    def waiting(gate):
        def work(x):
            gate.wait(5.0)
            return x
        return work

    first = Pipeline(iter(range(3)), [Stage("work", waiting(gates[0]))]).start()
    assert gcfreeze.holders() == 1 and gc.get_freeze_count() > 0
    second = Pipeline(iter(range(3)), [Stage("work", waiting(gates[1]))]).start()
    plain = Pipeline(iter(range(3)), [Stage("work", lambda x: x)], freeze_gc=False)
    assert plain.run(5.0) and gcfreeze.holders() == 2
    gates[0].set()
    assert first.join(5.0) and gcfreeze.holders() == 1 and gc.get_freeze_count() > 0
    gates[1].set()
    assert second.join(5.0) and gcfreeze.holders() == 0 and gc.get_freeze_count() == 0
    aborted = Pipeline(iter(range(1000)), [Stage("work", lambda x: time.sleep(0.01) or x)]).start()
    aborted.abort(5.0)
    assert gcfreeze.holders() == 0 and gc.get_freeze_count() == 0, "an aborted stream releases too"
