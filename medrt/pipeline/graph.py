"""The staged pipeline: a source thread, stage workers and a sink thread, joined by
bounded queues whose policy is stated per edge.

    source ─edge─▶ stage 1 ─edge─▶ stage 2 … ─edge─▶ sinks (in source order)

Each stage runs on its own worker thread(s), so frame N+1 is decoded and
pre-processed while frame N is in inference (double buffering). Items travel in
an :class:`Envelope` that carries the source order, so the sink thread can hand
results to the sinks in order even when a stage has several workers or an edge
drops items. An exception in a stage becomes a :class:`FrameError` for that item
and the pipeline goes on. Shutdown sends the :data:`~medrt.pipeline.queues.END`
sentinel down the graph; ``stop()`` completes within its deadline or aborts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, runtime_checkable

from medrt.errors import InputError, drop_tracebacks
from medrt.pipeline import gcfreeze
from medrt.pipeline.admission import Credits
from medrt.pipeline.queues import END, BoundedQueue, Policy, QueueClosed
from medrt.privacy import describe_exception

__all__ = [
    "Stage",
    "Envelope",
    "FrameError",
    "Sink",
    "Pipeline",
    "run_serial",
    "rule_depth",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stage:
    """A named step: ``fn(payload) -> payload`` on ``workers`` threads.

    With ``fan_out`` the function returns a sequence and each element travels on
    as its own item (decoding one multi-frame file gives one item per frame).
    """

    name: str
    fn: Callable[[Any], Any]
    workers: int = 1
    fan_out: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f'Argument "workers" of stage {self.name!r} must be >= 1, got {self.workers!r}.')


@dataclass(frozen=True, slots=True)
class Envelope:
    """One item in flight: the payload plus where it sits in the source order.

    ``seq`` numbers the source's items, ``sub`` the items one source item fanned
    out into, ``last`` marks the final one of a ``seq``. ``t_arrival`` is when the
    source produced it (``time.perf_counter``), the start of end-to-end latency.
    ``origin`` is the key of the source item it came from (the file path), kept
    when a stage fans out and ``key`` becomes the frame's.
    """

    seq: int
    key: str
    payload: Any
    t_arrival: float
    origin: str = ""
    sub: int = 0
    last: bool = True
    timings: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class FrameError:
    """A stage raised on this item. ``key`` names the input (file path or frame key).
    ``error`` is kept without its traceback (:func:`~medrt.errors.drop_tracebacks`)."""

    key: str
    stage: str
    error: BaseException

    def __post_init__(self) -> None:
        drop_tracebacks(self.error)

    @property
    def reason(self) -> str:
        return describe_exception(self.error)

    @property
    def why(self) -> str:
        """:attr:`reason` without the file an input error names (for a log line that names
        ``key`` already)."""
        err = self.error
        if isinstance(err, InputError):
            return f"{type(err).__name__}: {err.why}"
        return self.reason

    @property
    def skippable(self) -> bool:
        """True for input that is simply not for us (a non-DICOM file), not a failure."""
        return bool(getattr(self.error, "skippable", False))


@runtime_checkable
class Sink(Protocol):
    """Receives results in source order on the pipeline's sink thread."""

    def on_result(self, payload: Any, envelope: Envelope) -> None: ...

    def on_error(self, error: FrameError, envelope: Envelope) -> None: ...


def rule_depth(pre_ms: float, infer_ms: float) -> int:
    """The seed's rule for how many items to keep in flight: (pre + infer) / max(pre, infer),
    rounded up, and at least 2 so that one item is prepared while another is in inference."""
    if not (pre_ms > 0 and infer_ms > 0):
        return 2
    return max(2, math.ceil((pre_ms + infer_ms) / max(pre_ms, infer_ms)))


class _Orderer:
    """Releases envelopes in (seq, sub) order; gaps left by dropped items are skipped."""

    _GAP = object()

    def __init__(self, on_done: Callable[[int], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], Any] = {}
        self._next = (0, 0)
        self._on_done = on_done  # called with each seq whose last envelope has been released

    def offer(self, env: Envelope, value: Any) -> list[tuple[Envelope, Any]]:
        with self._lock:
            self._pending[(env.seq, env.sub)] = (env, value)
            return self._release()

    def gap(self, env: Envelope) -> list[tuple[Envelope, Any]]:
        with self._lock:
            self._pending[(env.seq, env.sub)] = (env, self._GAP)
            return self._release()

    def _release(self) -> list[tuple[Envelope, Any]]:
        out = []
        while self._next in self._pending:
            env, value = self._pending.pop(self._next)
            if value is not self._GAP:
                out.append((env, value))
            self._next = (env.seq + 1, 0) if env.last else (env.seq, env.sub + 1)
            if env.last and self._on_done is not None:
                self._on_done(env.seq)
        return out

    def flush(self) -> list[tuple[Envelope, Any]]:
        """Whatever is left at the end (only after an abort), in order."""
        with self._lock:
            items = [self._pending[k] for k in sorted(self._pending)]
            self._pending.clear()
        return [(env, v) for env, v in items if v is not self._GAP]


def _key_of(payload: Any) -> str:
    key = getattr(payload, "key", None)
    if isinstance(key, str):
        return key
    frame = getattr(payload, "frame", None)
    if frame is not None and isinstance(getattr(frame, "key", None), str):
        return frame.key
    return str(payload)


def _discarded(owner: weakref.ref[Pipeline], edge: str, env: Envelope) -> None:
    """A queue's discard callback: :meth:`Pipeline._discarded` of ``owner``, if it is still alive."""
    pipeline = owner()
    if pipeline is not None:
        pipeline._discarded(edge, env)


class Pipeline:
    """Wire ``source`` through ``stages`` into ``sinks``.

    ``policy`` is one policy for every edge or a mapping from edge name to policy;
    edges are named after the stage they feed (``"decode"``, …) and ``"sink"``.
    ``depth`` is the capacity of every edge; ``None`` starts at 2 and, after
    ``telemetry.warmup`` frames, applies :func:`rule_depth` to the measured
    stage times (``pre_stages`` before inference, the rest inference).
    ``telemetry`` is a :class:`medrt.pipeline.telemetry.Telemetry`, True for one
    made to fit this graph, or None.

    ``max_in_flight`` bounds the items between the entry and the sinks
    (:class:`medrt.pipeline.admission.Credits`), so a pipeline that cannot keep up
    leaves the backlog in the entry queue, where its policy applies: on a CPU that
    ran the 30 fps replay at 18 fps, unbounded, a frame reached the screen 0.7 s after
    it arrived. None: unbounded (the inner queues' depths bound it).
    """

    def __init__(
        self,
        source: Iterable[Any],
        stages: Sequence[Stage],
        sinks: Sequence[Sink] = (),
        *,
        policy: Policy | str | Mapping[str, Policy | str] = Policy.BLOCK,
        depth: int | None = None,
        telemetry: Any = None,
        pre_stages: Sequence[str] = ("decode", "preprocess"),
        name: str = "pipeline",
        freeze_gc: bool = True,
        max_in_flight: int | None = None,
    ) -> None:
        if not stages:
            raise ValueError('Argument "stages" must name at least one stage.')
        names = [s.name for s in stages]
        if len(set(names)) != len(names) or "sink" in names:
            raise ValueError(f'Argument "stages" must have unique names other than "sink", got {names}.')
        self.source = source
        self.stages = list(stages)
        self.sinks = list(sinks)
        self.telemetry = telemetry
        self.name = name
        self.pre_stages = tuple(pre_stages)
        self.auto_depth = depth is None
        self.depth = 2 if depth is None else int(depth)
        edges = [*names, "sink"]
        policies = policy if isinstance(policy, Mapping) else dict.fromkeys(edges, policy)
        unknown = set(policies) - set(edges)
        if unknown:
            raise ValueError(f'Argument "policy" names unknown edges {sorted(unknown)}; edges are {edges}.')
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f'Argument "max_in_flight" must be at least 1 or None, got {max_in_flight}.')
        self.credits = Credits(max_in_flight) if max_in_flight else None
        self._orderer = _Orderer(on_done=self.credits.done if self.credits is not None else None)
        # Each queue reaches back to the pipeline through a weak reference: a bound method
        # made a cycle (pipeline -> queue -> method -> pipeline) that kept a finished
        # pipeline, its sinks and every frame they hold (pixels, masks, headers) until a
        # full collection, which a process as large as the listener's runs every few
        # series: ~12 MB more resident per 40-slice series until then.
        owner = weakref.ref(self)
        self.queues = {e: BoundedQueue(e, self.depth, policies.get(e, Policy.BLOCK), partial(_discarded, owner, e))
                       for e in edges}
        self._gaps: deque[Envelope] = deque()  # discarded items, for the sink thread to skip
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._done = threading.Event()
        self._remaining = {s.name: s.workers for s in self.stages}
        self._lock = threading.Lock()
        self._seq = 0
        self.sink_errors = 0
        self.results = 0
        self.errors: list[FrameError] = []
        self._depth_applied = not self.auto_depth
        self._finished = False  # join has stopped telemetry and closed the stages
        # While it runs, objects older than the stream stay out of the cyclic GC
        # (medrt.pipeline.gcfreeze: a 370 ms full collection stalled the viewer otherwise).
        self.freeze_gc = freeze_gc
        self._gc_held = False
        if telemetry is True:
            self.make_telemetry()

    # -- lifecycle ------------------------------------------------------------

    def make_telemetry(self, warmup: int = 10) -> Any:
        """A :class:`~medrt.pipeline.telemetry.Telemetry` that knows this graph's stages and edges."""
        from medrt.pipeline.telemetry import Telemetry

        self.telemetry = Telemetry([s.name for s in self.stages], list(self.queues), warmup=warmup)
        return self.telemetry

    def start(self) -> Pipeline:
        if self._threads:
            raise RuntimeError("pipeline already started")
        if self.telemetry is not None:
            self.telemetry.start()
        if self.freeze_gc:
            gcfreeze.hold()
            self._gc_held = True
        self._spawn(self._source_loop, "source")
        for i, stage in enumerate(self.stages):
            out = self.queues[self.stages[i + 1].name] if i + 1 < len(self.stages) else self.queues["sink"]
            for w in range(stage.workers):
                self._spawn(self._stage_loop, f"{stage.name}-{w}", stage, self.queues[stage.name], out, i == 0)
        self._spawn(self._sink_loop, "sink")
        return self

    def _spawn(self, target: Callable[..., None], label: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=f"{self.name}-{label}", daemon=True)
        self._threads.append(t)
        t.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every item has reached the sinks; True when it finished. The first
        time it finishes it stops the telemetry and closes every stage function that has
        a ``close()``."""
        finished = self._done.wait(timeout)
        if finished and not self._finished:
            self._finished = True
            for t in self._threads:
                t.join(1.0)
            if self.telemetry is not None:
                self.telemetry.stop()
            for stage in self.stages:  # e.g. a ProcessDecoder's worker pool
                close = getattr(stage.fn, "close", None)
                if callable(close):
                    close()
        return finished

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop taking new items from the source, finish what is in flight, and shut down.
        After ``timeout`` seconds the queues are closed and in-flight items abandoned.
        Returns True for a clean shutdown."""
        close = getattr(self.source, "close", None)
        if callable(close):
            close()  # the source ends by its own rule (a QueueSource yields what it already holds)
        else:
            self._stop.set()
        if self.join(timeout):
            return True
        log.warning("%s: shutdown deadline of %.1f s passed; aborting in-flight items", self.name, timeout)
        for q in self.queues.values():
            q.close()
        self.join(2.0)
        return False

    def abort(self, timeout: float = 10.0) -> None:
        """Stop now: items in flight are abandoned (the sinks never see them); a sink call
        already running completes. For Ctrl-C in a batch, whose unfinished work is redone."""
        close = getattr(self.source, "close", None)
        if callable(close):
            close()
        self._stop.set()
        for q in self.queues.values():
            q.close()
        self.join(timeout)

    def run(self, timeout: float | None = None) -> bool:
        """Start, wait for the source to run dry and every item to reach the sinks."""
        self.start()
        return self.join(timeout)

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- threads --------------------------------------------------------------------

    def _put(self, q: BoundedQueue, env: Any) -> None:
        q.put(env)  # a refused item is accounted for by _discarded
        if self.telemetry is not None and env is not END:
            self.telemetry.record_depth(q.name, len(q))

    def _discarded(self, edge: str, env: Envelope) -> None:
        """A latest-policy edge dropped ``env`` or a reject-policy edge refused it.
        Runs on the producer's thread, so it only records the gap for the sink thread."""
        if self.telemetry is not None:
            if self.queues[edge].policy is Policy.REJECT:
                self.telemetry.count_reject(edge)
            else:
                self.telemetry.count_drop(edge)
            # the frame too (JSON lines, the summary's frames_dropped), not in latency or throughput
            self.telemetry.record_frame(env.key, dict(env.timings), (time.perf_counter() - env.t_arrival) * 1000.0,
                                        dropped=True)
        self._gaps.append(env)

    def _source_loop(self) -> None:
        first = self.queues[self.stages[0].name]
        # A source that holds items back (medrt.io.sources.Lookahead) says when each arrived.
        arrival = getattr(self.source, "arrival", None)
        try:
            for payload in self.source:
                if self._stop.is_set():
                    break
                key = _key_of(payload)
                t = (arrival(payload) if callable(arrival) else None) or time.perf_counter()
                env = Envelope(seq=self._seq, key=key, payload=payload, t_arrival=t, origin=key)
                self._seq += 1
                self._put(first, env)
        except QueueClosed:
            return
        except Exception as exc:  # a broken source ends the stream, reported once
            log.error("%s: source failed: %s: %s", self.name, type(exc).__name__, exc)
            self.errors.append(FrameError(key="<source>", stage="source", error=exc))
        try:
            first.put(END)
        except QueueClosed:
            pass

    def _stage_loop(self, stage: Stage, inq: BoundedQueue, out: BoundedQueue, entry: bool = False) -> None:
        credits = self.credits if entry else None  # max_in_flight: the first stage takes a credit per item
        try:
            while True:
                if credits is not None and not credits.take(lambda: inq.closed):
                    return
                env = inq.get()
                if credits is not None:
                    if env is END:
                        credits.give_back()
                    else:
                        credits.hold(env.seq)
                if env is END:
                    with self._lock:
                        self._remaining[stage.name] -= 1
                        last = self._remaining[stage.name] == 0
                    if last:
                        out.put(END)
                    else:
                        inq.put(END)  # let the sibling workers see it too
                    return
                for item in self._apply(stage, env):
                    self._put(out, item)
        except QueueClosed:
            return

    def _apply(self, stage: Stage, env: Envelope) -> list[Envelope]:
        if isinstance(env.payload, FrameError):
            return [env]
        t0 = time.perf_counter()
        try:
            value = stage.fn(env.payload)
        except Exception as exc:
            err = FrameError(key=env.key, stage=stage.name, error=exc)
            if getattr(exc, "skippable", False):  # e.g. a non-DICOM file in an image folder
                log.info("%s: skipping %s: %s", self.name, env.key, err.why)
            else:
                log.warning("%s: %s failed on %s: %s", self.name, stage.name, env.key, err.why)
                if self.telemetry is not None:
                    self.telemetry.count_error(stage.name)
            return [replace(env, payload=err)]
        ms = (time.perf_counter() - t0) * 1000.0
        if self.telemetry is not None:
            self.telemetry.record_stage(stage.name, ms)
        timings = (*env.timings, (stage.name, ms))
        if not stage.fan_out:
            return [replace(env, payload=value, timings=timings)]
        values = list(value)
        if not values:  # nothing came out: release the slot so order is kept
            self._gaps.append(env)
            return []
        n = len(values)
        share = ms / n
        timings = (*env.timings, (stage.name, share))
        return [replace(env, payload=v, key=_key_of(v), sub=i, last=env.last and i == n - 1, timings=timings)
                for i, v in enumerate(values)]

    def _drain_gaps(self) -> None:
        while self._gaps:
            self._deliver(self._orderer.gap(self._gaps.popleft()))

    def _sink_loop(self) -> None:
        """The only thread that calls sinks: results leave in source order."""
        q = self.queues["sink"]
        try:
            while True:
                try:
                    env = q.get(timeout=0.05)
                except TimeoutError:
                    self._drain_gaps()
                    continue
                self._drain_gaps()
                if env is END:
                    break
                self._deliver(self._orderer.offer(env, env.payload))
        except QueueClosed:
            pass
        finally:
            self._drain_gaps()
            self._deliver(self._orderer.flush())
            for sink in self.sinks:
                close = getattr(sink, "close", None)
                if callable(close):
                    try:
                        close()
                    except Exception as exc:
                        self.sink_errors += 1
                        log.error("%s: sink %r failed to close: %s", self.name, sink, exc)
            if self._gc_held:
                self._gc_held = False
                gcfreeze.release()
            self._done.set()

    def _deliver(self, ready: list[tuple[Envelope, Any]]) -> None:
        for env, value in ready:
            now = time.perf_counter()
            if isinstance(value, FrameError):
                self.errors.append(value)
            else:
                self.results += 1
            if self.telemetry is not None and not isinstance(value, FrameError):
                timings = getattr(value, "timings", None)  # a FrameResult's own steps (recheck apart)
                self.telemetry.record_frame(env.key, timings if timings is not None else dict(env.timings),
                                            (now - env.t_arrival) * 1000.0)
                self._maybe_apply_depth()
            for sink in self.sinks:
                try:
                    if isinstance(value, FrameError):
                        sink.on_error(value, env)
                    else:
                        sink.on_result(value, env)
                except Exception as exc:  # a broken sink must not stop the pipeline
                    self.sink_errors += 1
                    log.error("%s: sink %s failed on %s: %s: %s", self.name, type(sink).__name__, env.key,
                              type(exc).__name__, exc)

    def _maybe_apply_depth(self) -> None:
        """Once warm-up is over, size every edge by the seed's rule from the measured stage times."""
        if self.results % 100 == 0:
            self.telemetry.sample_memory()
        if self._depth_applied or self.results < self.telemetry.warmup + 10:
            return
        p50 = {s.name: self.telemetry.latency(s.name)["p50"] for s in self.stages}
        pre = sum(v for k, v in p50.items() if k in self.pre_stages and v == v)
        infer = sum(v for k, v in p50.items() if k not in self.pre_stages and v == v)
        self.depth = rule_depth(pre, infer)
        for q in self.queues.values():
            q.resize(self.depth)
        self._depth_applied = True
        log.info("%s: queue depth %d from measured stage times (pre %.1f ms, infer %.1f ms)",
                 self.name, self.depth, pre, infer)

    # -- reporting ------------------------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Per-edge drops, rejects and the deepest the queue got."""
        return {name: {"drops": q.drops, "rejects": q.rejects, "max_depth": q.max_depth, "depth": q.maxsize}
                for name, q in self.queues.items()}

    @property
    def in_flight(self) -> int:
        """Items the first stage has taken that have not left the orderer yet (counted
        only with ``max_in_flight``)."""
        return len(self.credits) if self.credits is not None else 0


@dataclass
class _SerialStats:
    results: int = 0
    errors: list[FrameError] = field(default_factory=list)


def run_serial(source: Iterable[Any], stages: Sequence[Stage], sinks: Sequence[Sink] = (),
               telemetry: Any = None) -> _SerialStats:
    """The same stages, one item at a time on this thread: the baseline for pipelined throughput."""
    stats = _SerialStats()
    if telemetry is not None:
        telemetry.start()
    seq = 0
    for payload in source:
        key = _key_of(payload)
        items = [Envelope(seq=seq, key=key, payload=payload, t_arrival=time.perf_counter(), origin=key)]
        seq += 1
        for stage in stages:
            nxt: list[Envelope] = []
            for env in items:
                if isinstance(env.payload, FrameError):
                    nxt.append(env)
                    continue
                t0 = time.perf_counter()
                try:
                    value = stage.fn(env.payload)
                except Exception as exc:
                    nxt.append(replace(env, payload=FrameError(env.key, stage.name, exc)))
                    continue
                ms = (time.perf_counter() - t0) * 1000.0
                if telemetry is not None:
                    telemetry.record_stage(stage.name, ms)
                values = list(value) if stage.fan_out else [value]
                for i, v in enumerate(values):
                    nxt.append(replace(env, payload=v, key=_key_of(v), sub=i,
                                       timings=(*env.timings, (stage.name, ms / max(1, len(values))))))
            items = nxt
        for env in items:
            if isinstance(env.payload, FrameError):
                stats.errors.append(env.payload)
                for sink in sinks:
                    sink.on_error(env.payload, env)
                continue
            stats.results += 1
            if telemetry is not None:
                timings = getattr(env.payload, "timings", None)
                telemetry.record_frame(env.key, timings if timings is not None else dict(env.timings),
                                       (time.perf_counter() - env.t_arrival) * 1000.0)
            for sink in sinks:
                sink.on_result(env.payload, env)
    if telemetry is not None:
        telemetry.stop()
    return stats
