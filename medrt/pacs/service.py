"""The listener's analysis worker: each complete series through the batch core.

A series in the spool is *due* once nothing has arrived for it for ``idle_s`` seconds
(:meth:`Spool.due`). :meth:`PacsService.run_once` takes each due series, runs
:func:`medrt.batch.run_batch` on its inbox folder with the one analyzer this process
loaded (warm, weights resident: every series shares it), which writes
``OUT/<SeriesInstanceUID>/`` (results.jsonl, errors.csv, report, ``series/*/seg.dcm``,
``sr.dcm``, ``sc/``), and hands the series to its :class:`~medrt.pacs.forward.Forwarder`,
which sends the SEG, SR and SC objects to each ``forward`` destination and, with
``to_sender``, to the address in ``peers`` of the AE that sent the series, on threads of
its own (one lane per destination): a slow or dead PACS never holds up the analysis of
the next series, nor the other destinations' copies.

Nothing is lost: a file that does not decode is named in that series' errors.csv and
the rest of the series is analysed; a series whose analysis raises is left ``failed``
with the reason and analysed again after ``retry_s`` (the batch core resumes what it
finished); results a destination refuses or cannot take leave the series ``unsent`` and
are sent again after ``retry_s``, each destination only what it lacks (the spool records
what each took, by content). Results that change (more images came) are sent again.

Each pass ends with the purges: with ``keep_s``, the received images of series done that
long ago (:meth:`Spool.purge`); with ``keep_results_s``, their results folders
(:func:`medrt.pacs.retention.purge_results`).

Without :meth:`start` (tests, benchmarks), :meth:`run_once` analyses what is due and
then sends what is ready in the same call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medrt.pacs.forward import Forwarder, result_files
from medrt.pacs.loop import BackgroundLoop
from medrt.pacs.retention import date_results, purge_results
from medrt.pacs.scu import Destination
from medrt.pacs.spool import SeriesState, Spool
from medrt.pacs.stow import StowDestination
from medrt.privacy import describe_exception

__all__ = ["PacsService", "SeriesOutcome", "result_files"]  # result_files: from medrt.pacs.forward

log = logging.getLogger(__name__)


@dataclass
class SeriesOutcome:
    series_uid: str
    state: str  # done | failed (analysis) | unsent (a destination did not take all) | receiving (redone later)
    frames: int = 0
    lesions: int = 0
    errors: int = 0
    skipped: int = 0
    forwarded: list[str] = field(default_factory=list)  # file names every destination holds (now or before)
    sent: dict[str, int] = field(default_factory=dict)  # destination -> files sent to it this time
    refused: dict[str, int] = field(default_factory=dict)  # destination -> files it refused or could not take
    destinations: list[str] = field(default_factory=list)  # where the results went (AET@HOST:PORT)
    detail: str = ""
    out: Path | None = None
    elapsed_s: float = 0.0  # from taking the series to this outcome (analysis, waiting to be sent, sending)
    analysed: bool = True  # False: only sent (again) this time; frames and lesions are those of the report
    started: float = field(default_factory=time.perf_counter, repr=False)

    def timed(self) -> SeriesOutcome:
        self.elapsed_s = time.perf_counter() - self.started
        return self


class PacsService(BackgroundLoop):
    """Turns due series in ``spool`` into results under ``out``, forwarded to ``forward``
    (one destination or several) and, with ``to_sender``, back to the sender's address in
    ``peers`` (calling AE title → :class:`Destination`)."""

    thread_name = "medrt-listener-worker"

    def __init__(self, spool: Spool, out: str | Path, analyzer: Any, *,
                 forward: Destination | StowDestination | Sequence[Destination | StowDestination] | None = None,
                 calling_ae: str = "MEDRT", idle_s: float = 10.0, retry_s: float = 60.0,
                 outputs: Any = None, workers: int = 1, keep_s: float | None = None,
                 keep_results_s: float | None = None,
                 forward_tls: Any = None, peers: Mapping[str, Destination] | None = None,
                 to_sender: bool = False, forward_timeout_s: float = 30.0) -> None:
        from medrt.batch import OutputOptions

        self.spool = spool
        self.out = Path(out)
        self.analyzer = analyzer
        self.forwarder = Forwarder(spool, self.out, forward=forward, peers=peers, to_sender=to_sender,
                                   calling_ae=calling_ae, forward_tls=forward_tls, timeout_s=forward_timeout_s,
                                   retry_s=retry_s, on_done=self._finished)
        self.idle_s = idle_s
        self.retry_s = retry_s
        self.outputs = outputs if outputs is not None else OutputOptions()
        self.workers = workers
        self.keep_s = keep_s  # None: keep received images for ever; else purge done series this much older
        self.keep_results_s = keep_results_s  # None: keep results for ever; else purge those done this much ago
        self.results_purged = 0  # series whose results were purged since start (medrt_results_purged_total)
        self._last_purge = self._last_results_purge = 0.0
        super().__init__()
        # The latest outcomes only (a listener runs for months), and how many of each state so far.
        self.outcomes: deque[SeriesOutcome] = deque(maxlen=256)
        self.processed: Counter[str] = Counter()
        self.on_outcome: Any = None  # callable(SeriesOutcome), e.g. the CLI's line per series; from either thread
        self._finish_lock = threading.Lock()

    @property
    def forward(self) -> Any:
        """The forwarder's destinations (set them to change where results go)."""
        return self.forwarder.forward

    @forward.setter
    def forward(self, value: Any) -> None:
        self.forwarder.forward = value

    @property
    def peers(self) -> dict[str, Destination]:
        """Calling AE title → the address results go back to with ``to_sender``."""
        return self.forwarder.peers

    def start(self, tick_s: float = 0.5) -> None:
        self.forwarder.start(tick_s)
        super().start(tick_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop both threads within ``timeout_s`` in all (systemd's TimeoutStopSec is 60)."""
        deadline = time.monotonic() + timeout_s
        super().stop(timeout_s)  # no new analysis (one under way stops between frames)
        self.forwarder.stop(max(0.0, deadline - time.monotonic()))

    # -- one pass ----------------------------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> list[SeriesOutcome]:
        """Analyse every series due now; returns what became of each. Without the threads
        running (no :meth:`start`), results are then sent in the same call, and the
        outcomes are those of the whole (analysis and forwarding)."""
        done = []
        inline = not self.forwarder.alive
        # No analysis runs between passes: a series still 'analysing' lost its outcome (the
        # index could not record it); without this it stayed so until a restart.
        stale = self.spool.release_analysing("its outcome could not be recorded (the spool's disk?); analysed again",
                                             now=now)
        if stale:
            log.warning("listener: %d series left 'analysing' by a failed pass: analysed again after --retry", stale)
        for state in self.spool.due(self.idle_s, retry_s=self.retry_s, now=now):
            if self._stop.is_set():
                break
            if self.forwarder.busy(state.series_uid) and not self.forwarder.recall(state.series_uid):
                continue  # its results are being sent: analysed again once that send ends
            if not self.spool.claim(state.series_uid, expect_received=state.last_received, now=now):
                continue  # an instance arrived since it was listed: not complete yet
            outcome = self._process(state)
            if outcome is None:
                continue  # analysed: the forwarder has it
            done.append(outcome)
            self._finished(outcome)
        if inline:
            done += self.forwarder.run_once(now)
        self._purge(now)
        return done

    def _finished(self, outcome: SeriesOutcome) -> None:
        with self._finish_lock:
            self.outcomes.append(outcome)
            self.processed[outcome.state] += 1
            if self.on_outcome is not None:
                self.on_outcome(outcome)

    def _purge(self, now: float | None) -> None:
        """Purge received images (once a minute) and results (once an hour: a pass reads
        the whole results folder, and retention is counted in days). Results go first, while
        the spool still knows when a series whose images go now was last sent."""
        t = time.time() if now is None else now
        if self.keep_results_s is not None and (now is not None or t - self._last_results_purge >= 3600.0):
            self._last_results_purge = t
            self.results_purged += len(purge_results(self.out, self.spool, self.keep_results_s, now=now))
        if self.keep_s is not None and (now is not None or t - self._last_purge >= 60.0):
            self._last_purge = t
            self.spool.purge(self.keep_s, now=now)

    def _process(self, state: SeriesState) -> SeriesOutcome | None:
        """Analyse one claimed series. Returns its outcome when it is finished here (done,
        failed, interrupted), or None once it is ``analysed`` and handed to the forwarder."""
        from medrt.batch import EXIT_FAILED, EXIT_INTERRUPTED, BatchConfig, run_batch

        uid = state.series_uid
        out = self.out / uid
        outcome = SeriesOutcome(uid, "failed", out=out)
        try:
            config = BatchConfig(input=self.spool.series_dir(uid), out=out, workers=self.workers,
                                 outputs=self.outputs)
            summary = run_batch(config, analyzer=self.analyzer, stop=self._stop)
        except Exception as exc:  # noqa: BLE001 - one series must not stop the listener; it is retried
            outcome.detail = f"analysis failed: {describe_exception(exc)}"
            log.error("listener: series %s: %s (retried in %.0f s)", uid, outcome.detail, self.retry_s)
            self.spool.mark(uid, "failed", outcome.detail, unless_received_after=state.last_received)
            return outcome.timed()
        if summary.unwritten:  # a full disk mid-series: its results are not whole, so not done
            why = "; ".join(sorted(set(summary.unwritten.values())))
            outcome.detail = f"analysis failed: its outputs could not be written ({why})"
            log.error("listener: series %s: %s (retried in %.0f s)", uid, outcome.detail, self.retry_s)
            self.spool.mark(uid, "failed", outcome.detail, unless_received_after=state.last_received)
            return outcome.timed()
        c = summary.report.get("counts", {})
        outcome.frames, outcome.lesions = int(c.get("frames", 0)), int(c.get("lesions", 0))
        outcome.errors, outcome.skipped = int(c.get("errors", 0)), int(c.get("skipped", 0))
        if summary.exit_code == EXIT_INTERRUPTED:
            outcome.state, outcome.detail = "receiving", "interrupted; resumed at the next start"
            self.spool.mark(uid, "receiving", outcome.detail)
            return outcome.timed()
        if summary.exit_code == EXIT_FAILED or (outcome.frames == 0 and outcome.errors):
            # nothing these models read (an SR, an MR series, ...), or none of its images
            # could be read: said beside "done", so the log and the spool never make it
            # look like a series analysed and found clean
            outcome.detail = f"nothing analysed ({outcome.errors} error(s), {outcome.skipped} passed over)"
        destinations, problems = self.forwarder.destinations(state)
        if result_files(out) and (destinations or problems):
            self.forwarder.submit(outcome)  # first: the forwarder may claim it the moment it is marked
            if self.spool.mark(uid, "analysed", outcome.detail, unless_received_after=state.last_received):
                self.forwarder.notify()
                return None
            self.forwarder.withdraw(uid)
            outcome.state = "receiving"  # more arrived meanwhile: analysed again once it is quiet
            return outcome.timed()
        outcome.state = "done"
        if self.spool.mark(uid, "done", outcome.detail, unless_received_after=state.last_received):
            date_results(self.spool, uid, out)
        else:
            outcome.state = "receiving"
        log.info("listener: series %s %s: %d frame(s), %d lesion(s), %d error(s), nowhere to send", uid,
                 outcome.state, outcome.frames, outcome.lesions, outcome.errors)
        return outcome.timed()
