"""The driver of ``medrt batch --ray``: the input scanned and planned as a local run plans
it, each unfinished series sent to a worker, its folder checked and written into OUT, a
lost worker's series sent again, and the run's outputs and report assembled as a local
run's are."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from medrt.batch.interrupts import DeferredInterrupts
from medrt.batch.plan import MANIFEST, SeriesPlan, relative, series_notes, settings_key
from medrt.batch.report import STEPS, write_report
from medrt.batch.run import (
    HISTOGRAM,
    RESULTS,
    BatchConfig,
    BatchSummary,
    _assemble,
    _for_these_models,
    _open,
    _unfinished,
    stop_after_writing,
)
from medrt.distributed.cluster import (
    RayOptions,
    Refusals,
    WorkerHandle,
    admit,
    agree,
    connect,
    first_ready,
    grow,
    lose,
    placements_for,
)
from medrt.distributed.worker import SeriesWorker, safe_relative
from medrt.engine.hardware import on_gpu
from medrt.io.atomic import atomic_write_bytes
from medrt.privacy import describe_exception

__all__ = ["run_distributed"]

log = logging.getLogger("medrt.distributed")


def _frame_timings(out: Path) -> Iterator[dict[str, Any]]:
    """Each frame's ``timings_ms`` in results.jsonl."""
    path = out / RESULTS
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line).get("timings_ms", {})


def _timings(out: Path) -> dict[str, Any]:
    """Per-step latency from the frames' own timings (results.jsonl), as a local run's report
    gives it: the cluster's workers time their frames; the driver's pipeline telemetry is
    not there to ask."""
    from medrt.pipeline.telemetry import latency_summary

    values: dict[str, list[float]] = {k: [] for k in STEPS}
    for t in _frame_timings(out):
        for k in STEPS:
            if k in t:
                values[k].append(float(t[k]))
    return {k: latency_summary(v) for k, v in values.items() if v}


def _histogram(out: Path) -> None:
    """latency.png, as a local run writes it: here the frames' analysis time on the workers
    (``total``; the driver saw no frame arrive, so there is no end-to-end latency to draw)."""
    from medrt.pipeline.render import histogram_png

    values = [float(t["total"]) for t in _frame_timings(out) if "total" in t]
    if values:
        atomic_write_bytes(out / HISTOGRAM, histogram_png(values, "Ray worker analysis"))


def run_distributed(config: BatchConfig, options: RayOptions | None = None, *,
                    progress: Callable[[int, int], None] | None = None,
                    stop: threading.Event | None = None,
                    on_event: Callable[[dict[str, Any]], None] | None = None) -> BatchSummary:
    """:func:`medrt.batch.run_batch` with the series analysed by Ray workers.

    ``config.analyzer`` is what each worker loads (``threads`` None: from its CPUs);
    ``options.workers`` and ``config.decode_workers`` shape each worker's pipeline
    (``config.workers`` and the process options are for local runs and not used).
    ``on_event`` is called on this thread with ``{"event": "started", "workers": [...]}``
    (each worker's host, node_id, pid, CPUs), then ``"series"`` for each series done
    (``uid``, ``worker`` index, ``pid``, ``node_id``) and ``"lost"`` for each worker lost.
    """
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    options = options or RayOptions()
    t0 = time.perf_counter()
    out, plan = _open(config)
    analyzer_config = config.analyzer
    if analyzer_config is None:
        from medrt.analyzer import AnalyzerConfig

        analyzer_config = AnalyzerConfig(threads=None)
    gpu = on_gpu(analyzer_config.backend, analyzer_config.device)
    started = connect(ray, options)
    pool: list[WorkerHandle] = []
    try:
        # in_flight series at once per worker, one pipeline each over the shared models: a
        # series of one radiograph alone would leave the worker's other cores idle
        remote = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=options.in_flight)(SeriesWorker)

        def launch(placement: tuple[dict[str, Any], Any]) -> WorkerHandle:
            resources, strategy = placement
            handle = remote.options(**resources, scheduling_strategy=strategy).remote(
                analyzer_config, config.outputs, resources["num_cpus"], options.workers, config.decode_workers,
                logging.getLogger().getEffectiveLevel())
            return WorkerHandle(handle, placement, ready=handle.describe.remote())

        pool = [launch(p) for p in placements_for(ray, options, gpu)]
        infos = first_ready(ray, pool, options)
        settings = agree(infos)
        key = settings_key(settings)
        log.info("ray: %d worker(s) on %d node(s): %s", len(pool), len({i["node_id"] for i in infos}),
                 ", ".join(f"{i['host']} ({i['cpus']:g} CPU, {i['backend']} {i['precision']})" for i in infos))
        if on_event is not None:
            on_event({"event": "started", "workers": [{k: i[k] for k in ("host", "node_id", "pid", "cpus")}
                                                      for i in infos]})
        plan.series, passed_over = _for_these_models(plan, Refusals(ray, next(w for w in pool if w.info).handle))
        plan.notes.extend(passed_over)
        series_dir = out / "series"
        pending = _unfinished(plan, series_dir, key)
        resumed = len(plan.series) - len(pending)
        log.info("ray: %d series, %d already finished, %d to analyse", len(plan.series), resumed, len(pending))
        total = sum(sp.n_frames for sp in pending)
        queue: deque[SeriesPlan] = deque(pending)
        tries: Counter[str] = Counter()
        in_flight: dict[Any, tuple[WorkerHandle, SeriesPlan]] = {}
        done_frames = 0
        analysed = 0
        lost = 0
        interrupted = False
        try:
            next_scan = time.monotonic() + options.node_scan_s
            while queue or in_flight:
                if stop is not None and stop.is_set():
                    interrupted = True
                    break
                if options.actors is None and queue and time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + options.node_scan_s
                    grow(ray, pool, launch, options, gpu)
                admit(ray, pool, infos[0], on_event)  # late or replacement workers, models loaded
                ready = [w for w in pool if w.alive and w.ready is None]
                if not ready and not in_flight and not any(w.alive and w.ready is not None for w in pool):
                    log.error("ray: every worker was lost; %d series left for a rerun", len(queue))
                    break
                for w in sorted(ready, key=lambda w: w.load):
                    while queue and w.load < options.in_flight:
                        sp = queue.popleft()
                        try:
                            files = [(relative(p, plan.root), p.read_bytes()) for p in sp.paths]
                        except OSError as exc:  # moved or deleted since the scan
                            _fail(plan, sp, f"cannot read {exc.filename}: {exc.strerror or exc}")
                            continue
                        in_flight[w.handle.analyse.remote(files, str(plan.root))] = (w, sp)
                        w.load += 1
                if not in_flight:
                    time.sleep(0.2)  # waiting for a replacement worker to load its models
                    continue
                finished_refs, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in finished_refs:
                    w, sp = in_flight.pop(ref)
                    w.load -= 1
                    try:
                        result = ray.get(ref)
                    except RayActorError as exc:
                        lost += lose(ray, w, pool, launch, exc, on_event)
                        tries[sp.uid] += 1
                        if tries[sp.uid] < options.attempts:
                            log.warning("ray: series %s goes to another worker (try %d of %d)", sp.uid,
                                        tries[sp.uid] + 1, options.attempts)
                            queue.appendleft(sp)
                        else:
                            _fail(plan, sp, f"its Ray worker died {tries[sp.uid]} times: {describe_exception(exc)}")
                        continue
                    except RayTaskError as exc:
                        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                        log.error("ray: series %s failed on %s: %s", sp.uid, w.get("host"),
                                  describe_exception(cause))
                        _fail(plan, sp, f"analysis failed on a Ray worker: {describe_exception(cause)}")
                        continue
                    problem = _store(series_dir / sp.folder_name, result["files"], sp, key)
                    if problem:
                        _fail(plan, sp, problem)
                        continue
                    analysed += 1
                    w.series += 1
                    w.frames += sp.n_frames
                    w.seconds += float(result["seconds"])
                    done_frames += sp.n_frames
                    if progress is not None:
                        progress(done_frames, total)
                    if on_event is not None:
                        on_event({"event": "series", "uid": sp.uid, "worker": pool.index(w), "pid": result["pid"],
                                  "node_id": result["node_id"]})
        except KeyboardInterrupt:
            interrupted = True
        if interrupted:  # the workers are killed below, with the series they held
            log.warning("batch: interrupted; finished series are kept, a rerun does the rest")
        elif queue:  # no worker left for them
            for sp in queue:
                _fail(plan, sp, "no Ray worker was left to analyse it")
    finally:
        for w in pool:
            ray.kill(w.handle, no_restart=True)
        if started:
            ray.shutdown()
    with DeferredInterrupts() as held:  # as in run_batch: the report first, then the interrupt
        summary = _assemble(plan, out, series_dir, key, interrupted, time.perf_counter() - t0)
        summary.series_resumed = resumed
        summary.series_analysed = analysed
        cluster = {
            "address": options.address,
            "workers": [w.row() for w in pool],
            "workers_lost": lost,
            "series_sent_again": sum(tries.values()),
        }
        engine = {"backend": infos[0]["backend"], "precision": infos[0]["precision"], "models": infos[0]["models"],
                  "processor": sorted({i["processor"] for i in infos})}
        _histogram(out)
        def report() -> dict[str, Any]:
            return write_report(summary, plan, settings, None, None, out, engine=engine, timings=_timings(out),
                                extra={"cluster": cluster})

        summary.report = report()
        stop_after_writing(summary, held, report)
    stop_after_writing(summary, held, report)  # one that came in between
    return summary


def _fail(plan: Any, sp: SeriesPlan, reason: str) -> None:
    """Every file of ``sp`` into errors.csv; its folder stays unfinished, so a rerun retries it."""
    plan.notes.extend(series_notes(sp, plan.root, "error", "ray", reason))


def _store(folder: Path, files: dict[str, bytes], sp: SeriesPlan, key: str) -> str | None:
    """Write a worker's series folder (manifest last); the reason it was refused, or None."""
    try:
        manifest = json.loads(files[MANIFEST])
    except (KeyError, ValueError):
        return "the worker sent a series folder without a readable manifest"
    if manifest.get("content_sha256") != sp.content_sha256:
        return "the worker analysed other bytes than this series' files (content hash differs)"
    if manifest.get("settings_key") != key:
        return "the worker analysed with other settings than the cluster agreed on"
    if folder.exists():
        shutil.rmtree(folder)
    for rel, data in files.items():
        if rel != MANIFEST:
            atomic_write_bytes(folder / safe_relative(rel), data)
    atomic_write_bytes(folder / MANIFEST, files[MANIFEST])
    return None
