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

:func:`listener_memory` (``medrt bench --only listener_memory --series N``) is the other
question a listener that runs for months raises: does it give back what a series took?
``medrt listen --idle 0.5`` runs in a process of its own (its resident memory alone, as a
service's), and is sent the sample series ``N`` times, one after another, each copy with
new Study, Series and SOP Instance UIDs (a new series every time, as a scanner sends),
by pynetdicom; ``VmRSS`` is read once each series' outcome line is printed.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from medrt.bench import SETTLE_S

__all__ = ["listener_memory", "listener_vs_batch"]


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


def _vm(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` (the resident peak) of process ``pid`` in MB (Linux)."""
    found = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024.0
    return found


def _copy_series(files: list[Path], folder: Path) -> list[Path]:
    """``files`` written into ``folder`` as a new series: new Study, Series and SOP Instance
    UIDs, pixel data as it was (still compressed)."""
    import pydicom
    from pydicom.uid import generate_uid

    study, series = generate_uid(), generate_uid()
    folder.mkdir(parents=True)
    copies = []
    for path in files:
        ds = pydicom.dcmread(path)
        ds.StudyInstanceUID, ds.SeriesInstanceUID = study, series
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        copy = folder / path.name
        ds.save_as(copy, enforce_file_format=True)
        copies.append(copy)
    return copies


class _ListenerProcess:
    """``medrt listen`` in a process of its own; its output read on a thread, a line per
    series outcome counted."""

    def __init__(self, root: Path, idle_s: float) -> None:
        import medrt

        env = dict(os.environ)
        here = str(Path(medrt.__file__).resolve().parents[1])  # this medrt, not another installed one
        env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "medrt", "listen", "--spool", str(root / "spool"), "--out", str(root / "results"),
             "--bind", "127.0.0.1", "--port", "0", "--idle", str(idle_s)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.port: int | None = None
        self.outcomes: list[str] = []
        self.tail: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name="bench-listener-output", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.tail = [*self.tail[-19:], line.rstrip()]
                started = re.search(r"^medrt listen: \S+ on 127\.0\.0\.1:(\d+)", line)
                if started and self.port is None:
                    self.port = int(started.group(1))
                elif line.startswith("series "):
                    self.outcomes.append(line.strip())
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait(self, what: str, ready: Any, timeout_s: float) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: ready() or self.proc.poll() is not None, timeout_s) or not ready():
                tail = "\n".join(self.tail[-8:])
                raise RuntimeError(f"bench: medrt listen: no {what} within {timeout_s:.0f} s "
                                   f"(exit status {self.proc.poll()}); its last lines:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _final_outcome(outcomes: list[str], uid: str, images: int) -> str | None:
    """The outcome line that ends series ``uid`` of ``images`` images (``"series UID: done, 40
    frame(s), ..."``, or one that failed), or None while it has only partial ones: a series
    whose sender paused for longer than ``--idle`` (a loaded host) is analysed with the images
    it had, reported ``receiving`` (more came meanwhile) or done with fewer frames, and analysed
    again, whole, once its last image has come and it is quiet again."""
    for line in reversed(outcomes):
        if line.startswith(f"series {uid}: "):
            partial = line.startswith((f"series {uid}: receiving, ", f"series {uid}: done, ")) and not line.startswith(
                f"series {uid}: done, {images} frame(s)")
            return None if partial else line
    return None


def listener_memory(series: int = 12, warmup: int = 2, folder: Path | None = None,
                    idle_s: float = 0.5) -> dict[str, Any]:
    """The listener's resident memory over ``series`` series sent one after another (see
    the module's docstring): after the ``warmup``-th and after the last, the growth
    between them in % and in MB per series (and over the later half of the series after
    the warm-up alone), the peak, and each series' reading."""
    import pydicom

    from medrt.bench.pipeline import default_stream

    if series <= warmup:
        raise ValueError(f"listener_memory: --series must be more than the {warmup} warm-up series, got {series}")
    folder = default_stream() if folder is None else Path(folder)
    files = sorted(folder.glob("*.dcm"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .dcm files to send")
    rss: list[float] = []
    lesions: set[int] = set()
    with tempfile.TemporaryDirectory(prefix="medrt-bench-listen-mem-") as tmp:
        root = Path(tmp)
        listener = _ListenerProcess(root, idle_s)
        try:
            listener.wait("start (the models loaded)", lambda: listener.port is not None, 600.0)
            assert listener.port is not None
            start = _vm(listener.proc.pid)["VmRSS"]
            for n in range(1, series + 1):
                copies = _copy_series(files, root / f"send{n}")
                uid = str(pydicom.dcmread(copies[0], stop_before_pixels=True).SeriesInstanceUID)
                images = len(copies)
                _send(copies, listener.port)
                for path in copies:
                    path.unlink()
                listener.wait(f"outcome for series {n}",
                              lambda uid=uid, images=images: _final_outcome(listener.outcomes, uid, images), 600.0)
                line = _final_outcome(listener.outcomes, uid, images)
                assert line is not None
                if ": done, " not in line:
                    raise RuntimeError(f"bench: series {n} did not end done: {line}")
                found = re.search(r", (\d+) lesion\(s\)", line)
                if found:
                    lesions.add(int(found.group(1)))
                rss.append(_vm(listener.proc.pid)["VmRSS"])
            peak = _vm(listener.proc.pid)["VmHWM"]
        finally:
            listener.stop()
    warm, last = rss[warmup - 1], rss[-1]
    half = warmup + (series - warmup) // 2  # the later half's growth: a warm-up that ended low does not count
    return {
        "series": series,
        "warmup_series": warmup,
        "images_per_series": len(files),
        "idle_s": idle_s,
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX", "2 (medrt's default)"),
        "rss_start_mb": round(start, 1),
        "rss_after_warmup_mb": round(warm, 1),
        "rss_last_mb": round(last, 1),
        "rss_peak_mb": round(peak, 1),
        "growth_pct": round(100.0 * (last - warm) / warm, 2),
        "mb_per_series": round((last - warm) / (series - warmup), 2),
        "mb_per_series_last_half": round((last - rss[half - 1]) / (series - half), 2),
        "rss_mb": [round(v, 1) for v in rss],
        "lesions": sorted(lesions),  # one value when every series found the same
    }
