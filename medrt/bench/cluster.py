"""The Ray benchmark: ``medrt batch --ray`` against a local ``medrt batch`` on the same
folder, side by side in one run, on a private Ray cluster of this machine's cores.

What it measures, per repeat (interleaved, each going first every other time), from the
call to the last output written, models loaded included (a batch run loads them too):

- *local*: :func:`medrt.batch.run_batch` in this process, the baseline;
- *one worker*: :func:`medrt.distributed.run_distributed` with the default layout, one Ray
  worker holding all the node's CPUs: what shipping each series through Ray's object store,
  analysing it in a temporary folder and sending its outputs back cost;
- *a worker per core*: one Ray worker of one CPU per core, each with its own models, series
  spread over them: on one machine, processes instead of pipeline threads.

``*_start_s`` is the part of each Ray time spent before the first series was sent: the
worker processes started and their models loaded (the local run loads its models too).

On one machine this measures Ray's cost, not its gain; the gain is more machines. The
cluster's start (once per run of the suite, as ``ray start`` is once per cluster) is
reported apart.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from medrt.bench import SETTLE_S

__all__ = ["ray_vs_local"]


def default_folder() -> Path:
    """The whole committed sample: the 40-slice CT series and three radiographs."""
    return Path(__file__).resolve().parents[2] / "sample_dicom"


def ray_vs_local(folder: Path | None = None, repeats: int = 1) -> dict[str, Any]:
    """Median figures over ``repeats`` (see the module's docstring)."""
    import ray

    from medrt.analyzer import load_analyzer
    from medrt.bands import usable_cores
    from medrt.batch import BatchConfig, run_batch
    from medrt.distributed import RayOptions, run_distributed
    from medrt.engine.hardware import cpu_layout

    folder = default_folder() if folder is None else Path(folder)
    cores = usable_cores()
    threads, workers = cpu_layout(cores, gpu=False)  # medrt batch's own layout
    times: dict[str, list[float]] = {"local": [], "one_worker": [], "worker_per_core": []}
    found: dict[str, set[tuple[int, int, int]]] = {k: set() for k in times}
    starts: dict[str, list[float]] = {"one_worker": [], "worker_per_core": []}  # until the models are loaded
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    cluster_start = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory(prefix="medrt-bench-ray-") as tmp:
            root = Path(tmp)

            def local(r: int) -> Any:
                analyzer = load_analyzer(threads=threads)
                return run_batch(BatchConfig(folder, root / f"local{r}", workers=workers), analyzer=analyzer)

            def ready_at(name: str, t1: float) -> Any:
                def on_event(event: dict[str, Any]) -> None:
                    if event["event"] == "started":
                        starts[name].append(time.perf_counter() - t1)
                return on_event

            def one_worker(r: int) -> Any:
                return run_distributed(BatchConfig(folder, root / f"one{r}"), RayOptions(address="local"),
                                       on_event=ready_at("one_worker", time.perf_counter()))

            def worker_per_core(r: int) -> Any:
                return run_distributed(BatchConfig(folder, root / f"per{r}"),
                                       RayOptions(address="local", actors=cores, cpus_per_actor=1),
                                       on_event=ready_at("worker_per_core", time.perf_counter()))

            runs = {"local": local, "one_worker": one_worker, "worker_per_core": worker_per_core}
            order = list(runs)
            for r in range(repeats):
                for name in order if r % 2 == 0 else order[::-1]:
                    time.sleep(SETTLE_S)
                    t1 = time.perf_counter()
                    summary = runs[name](r)
                    times[name].append(time.perf_counter() - t1)
                    if summary.series_analysed != summary.series:
                        raise RuntimeError(f"bench: {name} analysed {summary.series_analysed} of "
                                           f"{summary.series} series")
                    found[name].add((summary.series, summary.frames, summary.lesions))
    finally:
        ray.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    (series, frames, _), *_ = found["local"]
    return {
        "series": series,
        "frames": frames,
        "cores": cores,
        "cluster_start_s": round(cluster_start, 2),
        "local_s": round(med["local"], 2),
        "one_worker_s": round(med["one_worker"], 2),
        "worker_per_core_s": round(med["worker_per_core"], 2),
        "one_worker_vs_local": round(med["one_worker"] / med["local"], 3),
        "worker_per_core_vs_local": round(med["worker_per_core"] / med["local"], 3),
        # of which: starting the worker processes and loading their models, once per run
        "one_worker_start_s": round(statistics.median(starts["one_worker"]), 2),
        "worker_per_core_start_s": round(statistics.median(starts["worker_per_core"]), 2),
        "lesions": {k: sorted(v[2] for v in found[k]) for k in found},  # one value each when all agree
        "repeats": repeats,
    }
