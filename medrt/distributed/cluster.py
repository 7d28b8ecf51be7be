"""The Ray cluster a ``medrt batch --ray`` run uses: joining it, placing a worker per node
(or as ``--ray-workers`` asks), waiting for them to load the models, taking in nodes that
join later, replacing a lost worker, and refusing workers that disagree on medrt or its
models. Ray is imported by the caller and passed in (``ray``), so this imports no Ray."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from medrt.privacy import describe_exception

__all__ = ["ClusterError", "RayOptions", "ray_available", "WorkerHandle", "Refusals", "agree", "connect",
           "placements_for", "first_ready", "admit", "grow", "lose"]

log = logging.getLogger("medrt.distributed")


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


def _nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def placements_for(ray: Any, options: RayOptions, gpu: bool) -> list[tuple[dict[str, Any], Any]]:
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
class WorkerHandle:
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


class Refusals:
    """The ``refusal`` of the workers' analyzer, asked once per (modality, SOP class, Image
    Type, body part, view, plane)."""

    def __init__(self, ray: Any, handle: Any) -> None:
        self.ray, self.handle = ray, handle
        self.cache: dict[tuple[Any, ...], str | None] = {}

    def refusal(self, modality: str | None, sop_class_uid: str | None = None, image_type: tuple[str, ...] = (),
                body_part: str = "", view: str = "", plane: str = "") -> str | None:
        key = (modality, sop_class_uid, tuple(image_type), body_part, view, plane)
        if key not in self.cache:
            self.cache[key] = self.ray.get(self.handle.refusal.remote(*key))
        return self.cache[key]


def agree(infos: list[dict[str, Any]]) -> dict[str, Any]:
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


def connect(ray: Any, options: RayOptions) -> bool:
    """Join or start the cluster; True when this call started the Ray session (and so ends it)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": True, "configure_logging": False}
    if options.address == "local":  # a new cluster, even where `ray start` made one
        kwargs["include_dashboard"] = False
    address = options.address
    kwargs.update(options.init_kwargs)
    _reachable(options.address)
    # ray.init puts in a SIGTERM handler of its own (sys.exit): a batch stopped by systemd
    # or a scheduler would end without its report. Ours (SIGTERM as Ctrl-C) goes back.
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {options.address}: {exc}") from exc
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
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
    # A port that is open but is not Ray's (a typo'd port, another service): ray.init would
    # wait on it for good. A Ray head (GCS, or the client server of ray://) speaks gRPC.
    import grpc

    channel = grpc.insecure_channel(hostport)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        raise ClusterError(f"{hostport} accepts connections but does not answer as a Ray head (no gRPC "
                           f"within {timeout_s:g} s): is it the head's port (ray start prints it)?") from None
    finally:
        channel.close()


def grow(ray: Any, pool: list[WorkerHandle], launch: Callable[..., WorkerHandle], options: RayOptions,
          gpu: bool) -> None:
    """Workers for the nodes that joined the cluster since the run began (``ray start
    --address`` on another machine): they take series from the queue once their models are
    loaded. Only nodes never given a worker: a lost one is replaced by ``lose``, and one
    that could not join (other models, a crash on loading) is not tried again every scan."""
    manned = {w.node for w in pool}
    try:
        placements = placements_for(ray, options, gpu)
    except ClusterError:
        return
    for placement in placements:
        node = getattr(placement[1], "node_id", None)
        if node is not None and node not in manned:
            log.info("ray: node %s joined the cluster; starting a worker there", node[:12])
            pool.append(launch(placement))


def first_ready(ray: Any, pool: list[WorkerHandle], options: RayOptions) -> list[dict[str, Any]]:
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


def admit(ray: Any, pool: list[WorkerHandle], reference: dict[str, Any],
          on_event: Callable[[dict[str, Any]], None] | None) -> None:
    """Late or replacement workers whose models are loaded now join the pool, each once it
    agrees with ``reference`` (the first worker's :meth:`SeriesWorker.describe`); one that
    cannot join (other models, a crash while loading) is killed and named in the log."""
    from ray.exceptions import RayActorError, RayTaskError

    for w in pool:
        if w.ready is None or not w.alive:
            continue
        done, _ = ray.wait([w.ready], timeout=0)
        if not done:
            continue
        try:
            w.info, w.ready = ray.get(w.ready), None
            agree([reference, w.info])
            log.info("ray: a worker on %s joined", w.info["host"])
            if on_event is not None:
                on_event({"event": "joined", "worker": pool.index(w),
                          **{k: w.info[k] for k in ("host", "node_id", "pid", "cpus")}})
        except (RayActorError, RayTaskError, ClusterError) as exc:
            w.alive, w.ready = False, None
            ray.kill(w.handle, no_restart=True)
            log.warning("ray: a worker could not join: %s", describe_exception(exc))


def lose(ray: Any, w: WorkerHandle, pool: list[WorkerHandle], launch: Callable[..., WorkerHandle], exc: BaseException,
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
