"""The listener's worker: each complete series through the batch core, results forwarded.

A series in the spool is *due* once nothing has arrived for it for ``idle_s`` seconds
(:meth:`Spool.due`). :meth:`PacsService.run_once` takes each due series, runs
:func:`medrt.batch.run_batch` on its inbox folder with the one analyzer this process
loaded (warm, weights resident: every series shares it), which writes
``OUT/<SeriesInstanceUID>/`` (results.jsonl, errors.csv, report, ``series/*/seg.dcm``,
``sr.dcm``, ``sc/``), and then sends the SEG, SR and SC objects to each ``forward``
destination (C-STORE to a :class:`~medrt.pacs.scu.Destination`, STOW-RS to a
:class:`~medrt.pacs.stow.StowDestination`) and, with ``to_sender``, to the address in
``peers`` of the AE that sent the series (a site where several PACS send to one medrt
gets each its own results back).

Nothing is lost: a file that does not decode is named in that series' errors.csv and
the rest of the series is analysed; a series whose analysis raises, or whose results a
peer refuses or cannot take, is left ``failed`` with the reason and tried again after
``retry_s`` (the batch core resumes a finished series without analysing it again). The
spool records which result files (by content) each destination took, so a retry sends
each destination only what it lacks: a PACS that was up is not sent the same objects
twice because another was down. Results that change (more images came) are sent again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medrt.engine.registry import sha256_file
from medrt.pacs.loop import BackgroundLoop
from medrt.pacs.scu import Destination, ForwardError, send, taken
from medrt.pacs.spool import SeriesState, Spool
from medrt.pacs.stow import StowDestination, send_stow
from medrt.privacy import describe_exception

__all__ = ["PacsService", "SeriesOutcome", "result_files"]

log = logging.getLogger(__name__)


@dataclass
class SeriesOutcome:
    series_uid: str
    state: str  # done | failed | receiving (more arrived while it was analysed: redone later)
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
    elapsed_s: float = 0.0


def result_files(out: Path) -> list[Path]:
    """The DICOM objects a batch run wrote under ``out`` (SEG, SR, SC), in a stable order."""
    series = out / "series"
    found = sorted(series.glob("*/seg*.dcm")) + sorted(series.glob("*/sr.dcm")) + sorted(series.glob("*/sc/*.dcm"))
    return [p for p in found if not p.name.startswith(".")]


class PacsService(BackgroundLoop):
    """Turns due series in ``spool`` into results under ``out``, forwarded to ``forward``
    (one destination or several) and, with ``to_sender``, back to the sender's address in
    ``peers`` (calling AE title → :class:`Destination`)."""

    thread_name = "medrt-listener-worker"

    def __init__(self, spool: Spool, out: str | Path, analyzer: Any, *,
                 forward: Destination | StowDestination | Sequence[Destination | StowDestination] | None = None,
                 calling_ae: str = "MEDRT", idle_s: float = 10.0, retry_s: float = 60.0,
                 outputs: Any = None, workers: int = 1, keep_s: float | None = None,
                 forward_tls: Any = None, peers: Mapping[str, Destination] | None = None,
                 to_sender: bool = False, forward_timeout_s: float = 30.0) -> None:
        from medrt.batch import OutputOptions

        self.spool = spool
        self.out = Path(out)
        self.analyzer = analyzer
        self.forward = forward
        self.peers = dict(peers or {})
        self.to_sender = to_sender
        self.forward_tls = forward_tls  # ssl.SSLContext (medrt.pacs.scu.client_tls) or None
        self.calling_ae = calling_ae
        self.forward_timeout_s = forward_timeout_s
        # Destinations that took no association, and until when they are not tried again: a
        # peer down makes one series wait for the timeout per --retry, not every series.
        self._unreachable: dict[str, tuple[float, str]] = {}
        self.idle_s = idle_s
        self.retry_s = retry_s
        self.outputs = outputs if outputs is not None else OutputOptions()
        self.workers = workers
        self.keep_s = keep_s  # None: keep received images for ever; else purge done series this much older
        self._last_purge = 0.0
        super().__init__()
        # The latest outcomes only (a listener runs for months), and how many of each state so far.
        self.outcomes: deque[SeriesOutcome] = deque(maxlen=256)
        self.processed: Counter[str] = Counter()
        self.on_outcome: Any = None  # callable(SeriesOutcome), e.g. the CLI's line per series

    # -- one pass ----------------------------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> list[SeriesOutcome]:
        """Work through every series due now; returns what happened to each."""
        done = []
        for state in self.spool.due(self.idle_s, retry_s=self.retry_s, now=now):
            if self._stop.is_set():
                break
            if not self.spool.claim(state.series_uid, expect_received=state.last_received, now=now):
                continue  # an instance arrived since it was listed: not complete yet
            outcome = self._process(state, time.time() if now is None else now)
            done.append(outcome)
            self.outcomes.append(outcome)
            self.processed[outcome.state] += 1
            if self.on_outcome is not None:
                self.on_outcome(outcome)
        self._purge(now)
        return done

    def _purge(self, now: float | None) -> None:
        t = time.time() if now is None else now
        if self.keep_s is not None and (now is not None or t - self._last_purge >= 60.0):
            self._last_purge = t
            self.spool.purge(self.keep_s, now=now)

    def _process(self, state: SeriesState, now: float) -> SeriesOutcome:
        from medrt.batch import EXIT_FAILED, EXIT_INTERRUPTED, BatchConfig, run_batch

        t0 = time.perf_counter()
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
            return self._timed(outcome, t0)
        c = summary.report.get("counts", {})
        outcome.frames, outcome.lesions = int(c.get("frames", 0)), int(c.get("lesions", 0))
        outcome.errors, outcome.skipped = int(c.get("errors", 0)), int(c.get("skipped", 0))
        if summary.exit_code == EXIT_INTERRUPTED:
            outcome.state, outcome.detail = "receiving", "interrupted; resumed at the next start"
            self.spool.mark(uid, "receiving", outcome.detail)
            return self._timed(outcome, t0)
        if summary.exit_code == EXIT_FAILED:  # nothing these models read (an SR, an MR series, ...): not an error
            outcome.detail = f"nothing analysed ({outcome.errors} error(s), {outcome.skipped} passed over)"
        files = result_files(out)
        destinations, problems = self.destinations(state)
        outcome.destinations = [str(d) for d in destinations]
        if files and (destinations or problems):
            self.spool.mark(uid, "forwarding", unless_received_after=state.last_received)
            digests = {p: (p.relative_to(out).as_posix(), sha256_file(p)) for p in files}  # name, content
            delivered = set(files)
            for dest in destinations:
                outcome.sent[str(dest)] = 0
                refused, why = self._deliver(uid, digests, dest, outcome, now)
                delivered -= set(refused)
                if refused:
                    problems.append(why)
            outcome.forwarded = [p.name for p in files if p in delivered and destinations]
            if problems:
                outcome.detail = f"forwarding failed: {'; '.join(problems)}"
                log.error("listener: series %s: %s (retried in %.0f s; results kept in %s)", uid, outcome.detail,
                          self.retry_s, out)
                self.spool.mark(uid, "failed", outcome.detail, unless_received_after=state.last_received)
                return self._timed(outcome, t0)
        outcome.state = "done"
        if not self.spool.mark(uid, "done", outcome.detail, unless_received_after=state.last_received):
            outcome.state = "receiving"  # more arrived meanwhile: analysed again once it is quiet
        log.info("listener: series %s %s: %d frame(s), %d lesion(s), %d error(s), %d sent to %s", uid,
                 outcome.state, outcome.frames, outcome.lesions, outcome.errors, len(outcome.forwarded),
                 ", ".join(outcome.destinations) or "-")
        return self._timed(outcome, t0)

    def _deliver(self, uid: str, digests: dict[Path, tuple[str, str]], dest: Destination | StowDestination,
                 outcome: SeriesOutcome, now: float) -> tuple[list[Path], str]:
        """Send ``dest`` those of the files (path → name, sha256) it does not hold yet, as the
        spool recorded; returns those it did not take, and why. A destination that took no
        association is not tried again, for any series, before ``retry_s`` has passed."""
        key = str(dest)
        held = self.spool.deliveries(uid, key)
        pending = [p for p, (name, digest) in digests.items() if held.get(name) != digest]
        if not pending:
            return [], ""
        down = self._unreachable.get(key)
        if down is not None and now < down[0]:
            outcome.refused[key] = len(pending)
            return pending, (f"{dest} not tried: it took nothing {now - down[0] + self.retry_s:.0f} s ago "
                             f"({down[1]}); tried again after --retry")
        why = ""
        try:
            if isinstance(dest, StowDestination):
                statuses = send_stow(pending, dest, timeout_s=self.forward_timeout_s)
            else:
                statuses = send(pending, dest, calling_ae=self.calling_ae, tls=self.forward_tls,
                                timeout_s=self.forward_timeout_s)
        except (ForwardError, OSError) as exc:
            statuses, why = getattr(exc, "statuses", {}), describe_exception(exc)
            if not statuses:  # not one reply: down, unreachable, or refusing us (no association, HTTP 4xx/5xx)
                self._unreachable[key] = (now + self.retry_s, why)
        else:
            self._unreachable.pop(key, None)
        took = taken(statuses)
        self.spool.record_deliveries(uid, key, dict(digests[p] for p in took))
        outcome.sent[key] = len(took)
        refused = [p for p in pending if p not in took]
        outcome.refused[key] = len(refused)
        if refused and not why:
            why = f"{len(refused)} of {len(pending)} refused by {dest}"
        return refused, why

    def destinations(self, state: SeriesState) -> tuple[list[Destination | StowDestination], list[str]]:
        """Where a series' results go: every ``forward`` destination, then the sender's
        address with ``to_sender``; and what stands in the way: a sender with no address
        (no ``--peer`` for its AE title, or images indexed after a crash, whose sender is
        unknown). The other destinations are served all the same."""
        forward = self.forward
        found = [] if forward is None else [forward] if isinstance(forward, (Destination, StowDestination)) \
            else list(forward)
        problems = []
        if self.to_sender:
            dest = self.peers.get(state.calling_ae)
            if dest is None:
                problems.append(f"no address for the sender, AE {state.calling_ae or '(unknown)'}, to send the "
                                f"results back to (medrt listen --peer AET@HOST:PORT)")
            else:
                found.append(dest)
        return list(dict.fromkeys(found)), problems

    @staticmethod
    def _timed(outcome: SeriesOutcome, t0: float) -> SeriesOutcome:
        outcome.elapsed_s = time.perf_counter() - t0
        return outcome
