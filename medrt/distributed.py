"""Batch work past one machine: ``medrt batch INPUT --out OUT --ray ADDRESS``.

The driver (this process) scans INPUT, passes over the series an earlier run finished, and
hands each remaining series to a Ray actor that holds the models warm: by default one per
node, using all the node's CPUs, or one per GPU on GPU backends. The actor receives the
series' bytes through Ray's object store (no shared file system is assumed), analyses them
with the same :func:`medrt.batch.run_batch` as a local run, and sends the finished series
folder back. The driver checks it (content hash, settings), writes it into OUT as a local
run would (manifest last), and rebuilds results.jsonl, errors.csv and the report, so the
outputs, and a rerun that resumes, are the same whichever way a series was analysed.

A worker that dies, its process or its node, loses only the series it held: they go to
another worker, ``attempts`` times at most each, and a replacement worker is started where
its node is still alive. A series whose analysis raises is listed in errors.csv and left
unfinished, so the next run tries it again.

Every worker must run the same medrt and the same models (sha256) with the same settings:
the driver compares what each worker loaded and refuses a mixed cluster, naming the nodes.
Ray is imported only here, and only when a run asks for it (the ``ray`` extra).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from medrt import __version__
from medrt.batch.outputs import OutputOptions
from medrt.batch.plan import MANIFEST, SeriesPlan, relative, series_notes, settings_key
from medrt.batch.report import STEPS, write_report
from medrt.batch.run import (
    RESULTS,
    BatchConfig,
    BatchSummary,
    _assemble,
    _for_these_models,
    _open,
    _settings,
    _unfinished,
    run_batch,
)
from medrt.engine.hardware import cpu_layout, cpu_name, on_gpu
from medrt.io.atomic import atomic_write_bytes
from medrt.privacy import describe_exception

__all__ = ["RayOptions", "ClusterError", "SeriesWorker", "run_distributed", "ray_available"]

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """The Ray cluster cannot run this batch (unreachable, no room for a worker, workers that
    disagree on medrt or its models)."""


@dataclass(frozen=True)
class RayOptions:
    """Where and how to run. ``address``: ``"local"`` starts a private cluster on this machine
    for the run; ``"auto"`` joins the one ``ray start`` made on this machine; ``HOST:PORT`` a
    cluster's head (GCS); ``ray://HOST:10001`` through Ray Client."""

    address: str = "auto"
    actors: int | None = None  # None: one per node (per GPU on GPU backends)
    cpus_per_actor: float | None = None  # None: with actors=None, all of the node's CPUs; else 1
    gpus_per_actor: float | None = None  # None: 1 on GPU backends, else 0
    workers: int | None = None  # inference workers in each Ray worker's pipeline; None: from its CPUs
    in_flight: int = 2  # series each worker holds and analyses at once (a pipeline each, the models shared)
    attempts: int = 3  # a series whose worker died is sent again, this many times in all
    start_timeout_s: float = 600.0  # until the first worker has loaded the models
    join_grace_s: float = 30.0  # then how long the others are waited for; later ones join as they come
    node_scan_s: float = 10.0  # how often to look for nodes added to the cluster (default layout only)
    init_kwargs: dict[str, Any] = field(default_factory=dict)  # more ray.init arguments


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


class SeriesWorker:
    """A Ray actor: the models loaded once, then one series at a time through run_batch."""

    def __init__(self, analyzer_config: Any, outputs: OutputOptions, cpus: float, workers: int | None,
                 decode_workers: int, log_level: int = logging.WARNING) -> None:
        from medrt.analyzer import load_analyzer
        from medrt.privacy import setup_console_logging

        # the driver's level (--quiet: errors only; -v more): Ray prints a worker's log on the
        # driver's console, redacted here as medrt.cli redacts its own
        setup_console_logging(log_level, "%(levelname)s %(name)s: %(message)s")
        logging.getLogger().setLevel(log_level)
        threads, self.workers = cpu_layout(int(cpus), gpu=on_gpu(analyzer_config.backend, analyzer_config.device),
                                           workers=workers)
        if analyzer_config.threads is None and threads is not None:
            analyzer_config = replace(analyzer_config, threads=threads)
        self.analyzer = load_analyzer(analyzer_config)
        self.outputs = outputs
        self.decode_workers = decode_workers
        self.cpus = cpus

    def describe(self) -> dict[str, Any]:
        import ray

        return {"medrt": __version__, "settings": _settings(self.analyzer, self.outputs),
                "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "pid": os.getpid(), "processor": cpu_name(), "cpus": self.cpus, "workers": self.workers,
                "backend": self.analyzer.backend_name, "precision": self.analyzer.precision,
                "models": list(self.analyzer.models)}

    def refusal(self, modality: str | None, sop_class_uid: str | None) -> str | None:
        return self.analyzer.refusal(modality, sop_class_uid=sop_class_uid)

    def analyse(self, files: list[tuple[str, bytes]], root: str) -> dict[str, Any]:
        """Analyse one series, given as (path relative to the input folder, bytes) pairs;
        return its finished folder as {relative path: bytes} and where it ran. ``root`` is
        the input folder on the driver: a reason that quotes a file's path names it there,
        not in this worker's temporary copy."""
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="medrt-ray-") as tmp:
            inp, out = Path(tmp) / "in", Path(tmp) / "out"
            for rel, data in files:
                atomic_write_bytes(inp / _safe(rel), data)
            run_batch(BatchConfig(input=inp, out=out, workers=self.workers, decode_workers=self.decode_workers,
                                  outputs=self.outputs), analyzer=self.analyzer)
            folders = [d for d in (out / "series").iterdir() if d.is_dir()] if (out / "series").is_dir() else []
            if len(folders) != 1:
                raise RuntimeError(f"the worker found {len(folders)} series in the files it was sent, not 1")
            folder = folders[0]
            if not (folder / MANIFEST).is_file():
                raise RuntimeError("the worker's run did not finish the series")
            sent = {p.relative_to(folder).as_posix(): p.read_bytes()
                    for p in sorted(folder.rglob("*")) if p.is_file()}
            sent[MANIFEST] = _rehome(sent[MANIFEST], inp, root)
        import ray

        return {"files": sent, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "seconds": time.perf_counter() - t0}


def _rehome(manifest: bytes, here: Path, root: str) -> bytes:
    """The manifest with the notes' reasons quoting ``root`` where they quote ``here``."""
    data = json.loads(manifest)
    for note in data.get("notes", []):
        note["reason"] = note["reason"].replace(str(here), root)
    return json.dumps(data, indent=1).encode()


def _safe(rel: str) -> PurePosixPath:
    """``rel`` as a path that stays inside the folder it is joined to."""
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts:
        raise ValueError(f"{rel!r} is not a relative path inside the series")
    return p


def _nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _placements(ray: Any, options: RayOptions, gpu: bool) -> list[tuple[dict[str, Any], Any]]:
    """(actor options, scheduling strategy) for each worker to start."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    gpus = options.gpus_per_actor if options.gpus_per_actor is not None else (1.0 if gpu else 0.0)
    if options.actors is not None:
        cpus = options.cpus_per_actor if options.cpus_per_actor is not None else 1.0
        return [({"num_cpus": cpus, "num_gpus": gpus}, "SPREAD")] * options.actors
    out: list[tuple[dict[str, Any], Any]] = []
    for node in _nodes(ray):
        res = node.get("Resources", {})
        node_cpus, node_gpus = float(res.get("CPU", 0)), float(res.get("GPU", 0))
        if gpus > 0:
            count = int(node_gpus // gpus)
            cpus = options.cpus_per_actor if options.cpus_per_actor is not None else max(1.0, node_cpus // max(count, 1))
        else:
            cpus = options.cpus_per_actor if options.cpus_per_actor is not None else node_cpus
            count = int(node_cpus // cpus) if cpus > 0 else 0
            count = min(count, 1) if options.cpus_per_actor is None else count
        if node_cpus < cpus:
            count = 0
        strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
        out.extend([({"num_cpus": cpus, "num_gpus": gpus}, strategy)] * count)
    if not out:
        raise ClusterError(f"no node of the Ray cluster has room for a worker ({gpus:g} GPU each"
                           + (f", {options.cpus_per_actor:g} CPU" if options.cpus_per_actor else "")
                           + f"); cluster resources: {ray.cluster_resources()}")
    return out


@dataclass
class _Worker:
    handle: Any
    placement: tuple[dict[str, Any], Any]
    info: dict[str, Any] | None = None
    ready: Any = None  # the describe() call while the worker loads its models
    load: int = 0
    alive: bool = True
    series: int = 0
    frames: int = 0
    seconds: float = 0.0

    @property
    def node(self) -> str | None:
        """The node it was placed on (None: anywhere, with --ray-workers)."""
        return getattr(self.placement[1], "node_id", None)

    def get(self, key: str) -> Any:
        """What it said of itself once its models were loaded (None before)."""
        return (self.info or {}).get(key)

    def row(self) -> dict[str, Any]:
        """Its line in report.json's ``cluster.workers``."""
        return {"host": self.get("host"), "node_id": self.get("node_id") or self.node,
                "processor": self.get("processor"), "cpus": self.get("cpus"),
                "inference_workers": self.get("workers"), "series": self.series, "frames": self.frames,
                "series_s": round(self.seconds, 2), "lost": not self.alive}


class _Refusals:
    """The ``refusal`` of the workers' analyzer, asked once per (modality, SOP class)."""

    def __init__(self, ray: Any, handle: Any) -> None:
        self.ray, self.handle = ray, handle
        self.cache: dict[tuple[Any, Any], str | None] = {}

    def refusal(self, modality: str | None, sop_class_uid: str | None = None) -> str | None:
        key = (modality, sop_class_uid)
        if key not in self.cache:
            self.cache[key] = self.ray.get(self.handle.refusal.remote(modality, sop_class_uid))
        return self.cache[key]


def _agree(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings every worker shares; ClusterError naming the nodes when they differ."""
    first = infos[0]
    for other in infos[1:]:
        if other["medrt"] != first["medrt"] or other["settings"] != first["settings"]:
            fields = sorted(k for k in first["settings"] if first["settings"].get(k) != other["settings"].get(k))
            if other["medrt"] != first["medrt"]:
                fields.insert(0, "medrt")
            raise ClusterError(
                f"the workers on {first['host']} and {other['host']} differ in {', '.join(fields)}: "
                f"{ {k: first['settings'].get(k, first['medrt']) for k in fields} } against "
                f"{ {k: other['settings'].get(k, other['medrt']) for k in fields} }; install the same medrt "
                f"and models on every node (and pin --backend/--precision on a mixed cluster)")
    return first["settings"]


def _timings(out: Path) -> dict[str, Any]:
    """Per-step latency from the frames' own timings (results.jsonl), as a local run's report
    gives it: the cluster's workers time their frames; the driver's pipeline telemetry is
    not there to ask."""
    from medrt.pipeline.telemetry import latency_summary

    values: dict[str, list[float]] = {k: [] for k in STEPS}
    path = out / RESULTS
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                t = json.loads(line).get("timings_ms", {})
                for k in STEPS:
                    if k in t:
                        values[k].append(float(t[k]))
    return {k: latency_summary(v) for k, v in values.items() if v}


def _connect(ray: Any, options: RayOptions) -> bool:
    """Join or start the cluster; True when this call started the Ray session (and so ends it)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": False}
    if options.address == "local":  # a new cluster, even where `ray start` made one
        kwargs["include_dashboard"] = False
    address = options.address
    kwargs.update(options.init_kwargs)
    _reachable(options.address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {options.address}: {exc}") from exc
    return True


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """A head that does not answer at all: ClusterError now, where ray.init would wait on it
    (Ray retries a GCS that refuses connections for minutes)."""
    if address in ("local", "auto"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"--ray {address!r}: expected 'local', 'auto', HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterError(f"cannot reach the Ray cluster's head at {hostport}: {exc.strerror or exc}") from exc


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
    started = _connect(ray, options)
    pool: list[_Worker] = []
    try:
        # in_flight series at once per worker, one pipeline each over the shared models: a
        # series of one radiograph alone would leave the worker's other cores idle
        remote = ray.remote(max_restarts=0, max_task_retries=0, max_concurrency=options.in_flight)(SeriesWorker)

        def launch(placement: tuple[dict[str, Any], Any]) -> _Worker:
            resources, strategy = placement
            handle = remote.options(**resources, scheduling_strategy=strategy).remote(
                analyzer_config, config.outputs, resources["num_cpus"], options.workers, config.decode_workers,
                logging.getLogger().getEffectiveLevel())
            return _Worker(handle, placement, ready=handle.describe.remote())

        pool = [launch(p) for p in _placements(ray, options, gpu)]
        infos = _first_ready(ray, pool, options)
        settings = _agree(infos)
        key = settings_key(settings)
        log.info("ray: %d worker(s) on %d node(s): %s", len(pool), len({i["node_id"] for i in infos}),
                 ", ".join(f"{i['host']} ({i['cpus']:g} CPU, {i['backend']} {i['precision']})" for i in infos))
        if on_event is not None:
            on_event({"event": "started", "workers": [{k: i[k] for k in ("host", "node_id", "pid", "cpus")}
                                                      for i in infos]})
        plan.series, passed_over = _for_these_models(plan, _Refusals(ray, next(w for w in pool if w.info).handle))
        plan.notes.extend(passed_over)
        series_dir = out / "series"
        pending = _unfinished(plan, series_dir, key)
        resumed = len(plan.series) - len(pending)
        log.info("ray: %d series, %d already finished, %d to analyse", len(plan.series), resumed, len(pending))
        total = sum(sp.n_frames for sp in pending)
        queue: deque[SeriesPlan] = deque(pending)
        tries: Counter[str] = Counter()
        in_flight: dict[Any, tuple[_Worker, SeriesPlan]] = {}
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
                    _grow(ray, pool, launch, options, gpu)
                for w in pool:  # a late or replacement worker whose models are loaded joins the pool
                    if w.ready is not None and w.alive:
                        done, _ = ray.wait([w.ready], timeout=0)
                        if done:
                            try:
                                w.info, w.ready = ray.get(w.ready), None
                                _agree([infos[0], w.info])
                                log.info("ray: a worker on %s joined", w.info["host"])
                                if on_event is not None:
                                    on_event({"event": "joined", "worker": pool.index(w),
                                              **{k: w.info[k] for k in ("host", "node_id", "pid", "cpus")}})
                            except (RayActorError, RayTaskError, ClusterError) as exc:
                                w.alive, w.ready = False, None
                                ray.kill(w.handle, no_restart=True)
                                log.warning("ray: a worker could not join: %s", describe_exception(exc))
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
                        lost += _lose(ray, w, pool, launch, exc, on_event)
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
    summary.report = write_report(summary, plan, settings, None, None, out, engine=engine,
                                  timings=_timings(out), extra={"cluster": cluster})
    return summary


def _grow(ray: Any, pool: list[_Worker], launch: Callable[..., _Worker], options: RayOptions,
          gpu: bool) -> None:
    """Workers for the nodes that joined the cluster since the run began (``ray start
    --address`` on another machine): they take series from the queue once their models are
    loaded. Only nodes never given a worker: a lost one is replaced by ``_lose``, and one
    that could not join (other models, a crash on loading) is not tried again every scan."""
    manned = {w.node for w in pool}
    try:
        placements = _placements(ray, options, gpu)
    except ClusterError:
        return
    for placement in placements:
        node = getattr(placement[1], "node_id", None)
        if node is not None and node not in manned:
            log.info("ray: node %s joined the cluster; starting a worker there", node[:12])
            pool.append(launch(placement))


def _first_ready(ray: Any, pool: list[_Worker], options: RayOptions) -> list[dict[str, Any]]:
    """Wait until a worker has loaded the models, then ``join_grace_s`` at most for the rest;
    the infos of those ready. A node still starting (an autoscaler adding it, a slow disk)
    does not hold the batch back: its worker joins when ready. ClusterError when none
    starts within ``start_timeout_s``, or every one fails."""
    from ray.exceptions import RayActorError, RayTaskError

    owner = {w.ready: w for w in pool}
    deadline = time.monotonic() + options.start_timeout_s
    first_error: BaseException | None = None
    while waiting := [w.ready for w in pool if w.ready is not None]:
        done, _ = ray.wait(waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            if any(w.info is not None for w in pool):
                break  # the others join when they are ready
            raise ClusterError(f"{len(pool)} Ray worker(s) did not start within {options.start_timeout_s:g} s "
                               f"(resources asked: {pool[0].placement[0]}; cluster: "
                               f"{ray.cluster_resources()})")
        w = owner[done[0]]
        try:
            first = not any(x.info is not None for x in pool)
            w.info, w.ready = ray.get(done[0]), None
            if first:
                deadline = min(deadline, time.monotonic() + options.join_grace_s)
        except (RayActorError, RayTaskError) as exc:
            w.alive, w.ready = False, None
            first_error = first_error or exc
            if not any(x.alive for x in pool):
                raise ClusterError(f"a Ray worker could not load the models: {describe_exception(exc)}") from exc
    if not any(w.info is not None for w in pool):
        raise ClusterError(f"no Ray worker could load the models: {describe_exception(first_error)}")
    return [w.info for w in pool if w.info is not None]


def _lose(ray: Any, w: _Worker, pool: list[_Worker], launch: Callable[..., _Worker], exc: BaseException,
          on_event: Callable[[dict[str, Any]], None] | None) -> int:
    """Mark ``w`` lost (once) and start a replacement where its node is still alive."""
    if not w.alive:
        return 0
    w.alive = False
    host, node = w.get("host"), w.get("node_id")
    log.warning("ray: lost the worker on %s (%s)", host, type(exc).__name__)
    if on_event is not None:
        on_event({"event": "lost", "worker": pool.index(w), "node_id": node, "pid": w.get("pid")})
    if any(n["NodeID"] == node for n in _nodes(ray)):
        pool.append(launch(w.placement))
    return 1


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
            atomic_write_bytes(folder / _safe(rel), data)
    atomic_write_bytes(folder / MANIFEST, files[MANIFEST])
    return None
