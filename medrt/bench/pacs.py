"""The listener's benchmark: a CT series sent by C-STORE, analysed, and its SEG/SR
forwarded, against ``medrt batch`` on the same files, side by side in one run.

What it measures, per repeat (interleaved with the baseline):

- *ingest*: C-STORE of every file over one association (pynetdicom as the scanner) to a
  :class:`~medrt.pacs.scp.Listener`, each image fsync'd and indexed before its Success;
- *series*: the listener's work once the series is complete (``idle_s`` 0): the batch
  core with the same warm analyzer, then the SEG and SR C-STOREd to a second listener
  standing in for the PACS;
- *batch*: :func:`medrt.batch.run_batch` on the original files, the baseline.

``series_vs_batch`` is the listener's series time over the batch time: what the
spool, the index and forwarding cost on top of the analysis.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from medrt.bench import SETTLE_S

__all__ = ["listener_vs_batch"]


def _send(files: list[Path], port: int) -> float:
    """C-STORE ``files`` to MEDRT@127.0.0.1:``port`` with the listener's own SCU
    (:func:`medrt.pacs.scu.send`); seconds from reading their headers to the last Success."""
    from medrt.pacs.scu import Destination, send

    t0 = time.perf_counter()
    statuses = send(files, Destination("MEDRT", "127.0.0.1", port), calling_ae="BENCH")
    elapsed = time.perf_counter() - t0
    refused = {p.name: hex(s) for p, s in statuses.items() if s != 0}
    if refused:
        raise RuntimeError(f"bench: not acknowledged: {refused}")
    return elapsed


def listener_vs_batch(folder: Path | None = None, repeats: int = 3, workers: int = 2) -> dict[str, Any]:
    """Median figures over ``repeats`` (see the module's docstring)."""
    from medrt.analyzer import load_analyzer
    from medrt.batch import BatchConfig, run_batch
    from medrt.bench.pipeline import default_stream
    from medrt.pacs.scp import Listener
    from medrt.pacs.scu import Destination
    from medrt.pacs.service import PacsService
    from medrt.pacs.spool import Spool

    folder = default_stream() if folder is None else Path(folder)
    files = sorted(folder.glob("*.dcm"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .dcm files to send")
    analyzer = load_analyzer(threads=1)
    ingest, series, batch = [], [], []
    lesions: dict[str, set[int]] = {"batch": set(), "listener": set()}
    with tempfile.TemporaryDirectory(prefix="medrt-bench-pacs-") as tmp:
        root = Path(tmp)
        pacs_spool = Spool(root / "pacs")
        with Listener(pacs_spool, ae_title="PACS", host="127.0.0.1", port=0) as pacs:
            dest = Destination("PACS", "127.0.0.1", pacs.port)
            def baseline(r: int) -> None:
                time.sleep(SETTLE_S)
                t0 = time.perf_counter()
                summary = run_batch(BatchConfig(input=folder, out=root / f"batch{r}", workers=workers),
                                    analyzer=analyzer)
                batch.append(time.perf_counter() - t0)
                lesions["batch"].add(summary.series_lesions)  # each lesion once, as the listener counts

            def listened(r: int) -> None:
                spool = Spool(root / f"spool{r}")
                service = PacsService(spool, root / f"out{r}", analyzer, forward=dest, idle_s=0.0, workers=workers)
                with Listener(spool, host="127.0.0.1", port=0) as listener:
                    time.sleep(SETTLE_S)
                    ingest.append(_send(files, listener.port))
                t0 = time.perf_counter()
                (outcome,) = service.run_once()
                series.append(time.perf_counter() - t0)
                spool.close()
                if outcome.state != "done":
                    raise RuntimeError(f"bench: the series ended {outcome.state}: {outcome.detail}")
                lesions["listener"].add(outcome.lesions)

            for r in range(repeats):  # each goes first every other time: no order favours either
                for step in ((baseline, listened) if r % 2 == 0 else (listened, baseline)):
                    step(r)
        pacs_spool.close()
    n = len(files)
    med = statistics.median
    return {
        "images": n,
        "ingest_images_per_s": round(n / med(ingest), 1),
        "ingest_ms_per_image": round(1000 * med(ingest) / n, 2),
        "series_s": round(med(series), 2),
        "batch_s": round(med(batch), 2),
        "series_vs_batch": round(med(series) / med(batch), 3),
        "lesions_listener": sorted(lesions["listener"]),  # one value each when every run found the same
        "lesions_batch": sorted(lesions["batch"]),
        "repeats": repeats,
        "workers": workers,
    }
