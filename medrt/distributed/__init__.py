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

The package: :mod:`~medrt.distributed.driver` runs the batch (:func:`run_distributed`: the
queue, sending series out, taking them back); :mod:`~medrt.distributed.cluster` joins the
cluster and keeps its workers (placement, start-up, late and lost workers, agreement);
:mod:`~medrt.distributed.worker` is the Ray actor that runs on each node.
"""

from medrt.distributed.cluster import ClusterError, RayOptions, ray_available
from medrt.distributed.driver import run_distributed
from medrt.distributed.worker import SeriesWorker

__all__ = ["RayOptions", "ClusterError", "SeriesWorker", "run_distributed", "ray_available"]
