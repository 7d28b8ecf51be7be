"""The listener's forwarder: a series' results to each destination, off the analysis thread.

The analysis worker (:class:`~medrt.pacs.service.PacsService`) writes a series' SEG, SR
and SC objects, marks it ``analysed`` in the spool and goes on to the next series. The
forwarder takes ``analysed`` series and sends their results to every destination: C-STORE
to a :class:`~medrt.pacs.scu.Destination`, STOW-RS to a
:class:`~medrt.pacs.stow.StowDestination`, and with ``to_sender`` back to the sender's
address in ``peers``. A PACS that is slow (minutes per object) or dead (a connect timeout
each time) delays only the sending, never the analysis of what scanners send next.

What a destination took is recorded in the spool by content (:meth:`Spool.record_deliveries`),
so a series that was not wholly taken (``unsent``, with the reason) is sent again after
``retry_s`` with only what each destination lacks, and without being analysed again. A
destination that took no association is not tried again for any series before
``retry_s`` has passed: a peer down costs one timeout per ``--retry``, not one per series.

Each destination has a lane of its own: a thread that sends it one series after another,
in the order they were analysed. This thread claims each series (``forwarding``) and puts
it in the lane of each of its destinations; the series is finished (``done`` or
``unsent``) once the last lane has answered for it. So a slow archive holds back only its
own copies: the reading room's workstation has each series as soon as it is analysed,
however far behind the archive is. A lane's thread ends when it has nothing to send.
New images for a series that waits in a lane (late slices, a re-sent series) take it out
of each lane that has not begun to send it (:meth:`Forwarder.recall`): it is analysed
again at once, and those destinations get only the new results.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrt.engine.registry import sha256_file
from medrt.pacs.loop import BackgroundLoop
from medrt.pacs.retention import date_results
from medrt.pacs.scu import Destination, ForwardError, send, taken
from medrt.pacs.spool import SeriesState, Spool
from medrt.pacs.stow import StowDestination, send_stow
from medrt.privacy import describe_exception

if TYPE_CHECKING:
    from medrt.pacs.service import SeriesOutcome

__all__ = ["Forwarder", "result_files"]

log = logging.getLogger(__name__)

AnyDestination = Destination | StowDestination


def result_files(out: Path) -> list[Path]:
    """The DICOM objects a batch run wrote under ``out`` (SEG, SR, SC), in a stable order."""
    series = out / "series"
    found = sorted(series.glob("*/seg*.dcm")) + sorted(series.glob("*/sr.dcm")) + sorted(series.glob("*/sc/*.dcm"))
    return [p for p in found if not p.name.startswith(".")]


class _Lane:
    """One destination's sends, in order, on a thread that runs while there is something to
    send (started by :meth:`put`, ended when the queue is empty: nothing idles)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: deque[tuple[str, Callable[[], None]]] = deque()  # (series, its send)
        self._lock = threading.Lock()
        self._running = False
        self._sending = False  # a job under way (taken off the queue)

    @property
    def depth(self) -> int:
        """Series waiting in this lane, the one being sent included."""
        with self._lock:
            return len(self._jobs) + self._sending

    def put(self, series_uid: str, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.append((series_uid, job))
            if self._running:
                return
            self._running = True
        try:
            threading.Thread(target=self._drain, name=f"medrt-forward-to-{self.name}", daemon=True).start()
        except RuntimeError:  # no thread to be had: the job is not queued (the series is left unsent)
            with self._lock:
                self._jobs.remove((series_uid, job))
                self._running = False
            raise

    def cancel(self, series_uid: str) -> int:
        """Take the series' sends out of the queue (not one under way); returns how many."""
        with self._lock:
            kept = deque(item for item in self._jobs if item[0] != series_uid)
            taken, self._jobs = len(self._jobs) - len(kept), kept
            return taken

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._running = False
                    return
                _, job = self._jobs.popleft()
                self._sending = True
            try:
                job()
            except Exception:  # noqa: BLE001 - a job reports its own failures; this is a bug's last net
                log.exception("forward: lane %s: a send failed", self.name)
            finally:
                with self._lock:
                    self._sending = False


@dataclass
class _Sending:
    """A series claimed for sending, while its lanes answer."""

    state: SeriesState
    outcome: SeriesOutcome
    digests: dict[Path, tuple[str, str]]  # each result file -> (name under the results folder, sha256)
    left: int  # lanes yet to answer
    problems: list[str] = field(default_factory=list)
    delivered: set[Path] = field(default_factory=set)
    stopped: bool = False  # a lane was stopped before it sent: the series waits for the next start
    recalled: list[str] = field(default_factory=list)  # lanes it was taken out of: new images came
    failed_at: float = 0.0  # when the last lane that failed answered: --retry counts from it


class Forwarder(BackgroundLoop):
    """Sends the results of ``analysed`` (and, after ``retry_s``, ``unsent``) series in
    ``spool``, found under ``out/<SeriesInstanceUID>/``, to ``forward`` and, with
    ``to_sender``, to the sender's address in ``peers``; hands each finished
    :class:`~medrt.pacs.service.SeriesOutcome` to ``on_done`` (from the thread of the
    destination that answered last)."""

    thread_name = "medrt-listener-forwarder"

    def __init__(self, spool: Spool, out: str | Path, *,
                 forward: AnyDestination | Sequence[AnyDestination] | None = None,
                 peers: Mapping[str, Destination] | None = None, to_sender: bool = False,
                 calling_ae: str = "MEDRT", forward_tls: Any = None, timeout_s: float = 30.0,
                 retry_s: float = 60.0, on_done: Callable[[SeriesOutcome], None] | None = None) -> None:
        super().__init__()
        self.spool = spool
        self.out = Path(out)
        self.forward = forward
        self.peers = dict(peers or {})
        self.to_sender = to_sender
        self.calling_ae = calling_ae
        self.forward_tls = forward_tls  # ssl.SSLContext (medrt.pacs.scu.client_tls) or None
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.on_done = on_done
        # Destinations that took no association, and until when they are not tried again
        # (each key is only touched by its own lane).
        self._unreachable: dict[str, tuple[float, str]] = {}
        self._lock = threading.Condition()
        self._pending: dict[str, SeriesOutcome] = {}  # analysed here, with the analysis' counts and start
        self._sending: dict[str, _Sending | None] = {}  # claimed, until finished (None: being dispatched)
        self._wanted: set[str] = set()  # claimed by a run_once that waits for their outcomes
        self._finished: dict[str, SeriesOutcome] = {}  # those outcomes, until it takes them
        self._lanes: dict[str, _Lane] = {}

    # -- from the analysis worker ------------------------------------------------------------------------------

    def submit(self, outcome: SeriesOutcome) -> None:
        """A series the worker is about to mark ``analysed``: its outcome (the analysis'
        counts and start, so the line and the duration cover both), held for the pass that
        claims it. The worker calls this before the mark, since this thread may claim the
        series the moment it is marked, and :meth:`notify` after it."""
        with self._lock:
            self._pending[outcome.series_uid] = outcome

    def withdraw(self, series_uid: str) -> None:
        """The worker could not mark it ``analysed`` (an image came): it is analysed again."""
        with self._lock:
            self._pending.pop(series_uid, None)

    def busy(self, series_uid: str) -> bool:
        """Whether this series' results are being sent now, or wait in a lane (the worker
        does not rewrite them meanwhile: an image that came during the send waits for it)."""
        with self._lock:
            return series_uid in self._sending

    def recall(self, series_uid: str) -> bool:
        """New images came for a series whose results wait in a lane (the worker found it
        ``receiving`` again while :meth:`busy`): take it out of each lane that has not begun
        to send it, so it is analysed again now, not once the slowest destination's queue
        reaches it, and those destinations get only the new results. Returns whether it is
        free now. A send under way is not recalled (it is reading the files); the series is
        free when that send ends."""
        with self._lock:
            job = self._sending.get(series_uid)
            if job is None:
                return series_uid not in self._sending
        recalled = [name for name in job.outcome.destinations
                    if (lane := self._lanes.get(name)) is not None and lane.cancel(series_uid)]
        if not recalled:
            return False
        with self._lock:
            job.recalled += recalled
            job.delivered.clear()  # what every destination took: the recalled ones took nothing
            job.left -= len(recalled)
            last = job.left == 0
        if last:
            self._finish(job)
        return last

    def backlog(self) -> dict[str, int]:
        """Series waiting for each destination (in its lane, or being sent to it): every
        ``forward`` destination, and every sender's address results went back to. A number
        that keeps growing is a destination slower than the scanners."""
        found = dict.fromkeys(map(str, self._forward_list()), 0)
        for name, lane in list(self._lanes.items()):
            found[name] = lane.depth
        return found

    # -- one pass ----------------------------------------------------------------------------------------------

    def run_once(self, now: float | None = None, *, wait: bool | None = None) -> list[SeriesOutcome]:
        """Claim every series due now and put it in its destinations' lanes. With ``wait``
        (by default when this forwarder's thread is not running: tests, benchmarks, the
        worker's inline pass), wait until they are finished and return what became of
        each; else return at once (each outcome goes to ``on_done``)."""
        wait = not self.alive if wait is None else wait
        claimed = []
        # A series 'forwarding' that no lane holds lost its outcome (the index could not
        # record it): 'unsent' again, sent after --retry (it stayed so until a restart).
        with self._lock:
            held = set(self._sending)
        stale = self.spool.release_forwarding(held, "its send ended but could not be recorded (the spool's disk?); "
                                                    "sent again", now=now)
        if stale:
            log.warning("listener: %d series left 'forwarding' by a failed pass: sent again after --retry", stale)
        for state in self.spool.to_send(retry_s=self.retry_s, now=now):
            if self._stop.is_set():
                break
            uid = state.series_uid
            with self._lock:
                if uid in self._sending:
                    continue
                self._sending[uid] = None
            try:
                ok = self.spool.claim_send(uid, expect_received=state.last_received, now=now)
            except BaseException:
                self._release(uid)
                raise
            if not ok:  # an image came since it was listed: analysed again first (a new outcome then)
                self.withdraw(uid)
                self._release(uid)
                continue
            with self._lock:
                outcome = self._pending.pop(uid, None)
                if wait:
                    self._wanted.add(uid)
            claimed.append(uid)
            outcome = outcome or self._outcome(uid)
            try:
                self._dispatch(state, outcome, now)
            except Exception as exc:  # noqa: BLE001 - e.g. a result file unreadable: sent again, not stuck
                outcome.state, outcome.detail = "unsent", f"forwarding failed: {describe_exception(exc)}"
                log.error("listener: series %s: %s (sent again in %.0f s)", uid, outcome.detail, self.retry_s)
                try:
                    self.spool.mark(uid, "unsent", outcome.detail, unless_received_after=state.last_received)
                finally:
                    self._done(uid, outcome.timed())
        if not wait:
            return []
        with self._lock:
            self._lock.wait_for(lambda: all(uid not in self._sending for uid in claimed))
            return [self._finished.pop(uid) for uid in claimed if uid in self._finished]

    def stop(self, timeout_s: float = 30.0) -> None:
        """Claim nothing more; series waiting in a lane are left ``analysed`` for the next
        start. Waits up to ``timeout_s`` for the sends under way (each is bounded by the
        forward timeout; one still running after that ends on its own thread)."""
        deadline = time.monotonic() + timeout_s
        super().stop(timeout_s)
        with self._lock:
            self._lock.wait_for(lambda: not self._sending, timeout=max(0.0, deadline - time.monotonic()))

    def _release(self, uid: str) -> None:
        with self._lock:
            self._sending.pop(uid, None)
            self._lock.notify_all()

    def _outcome(self, uid: str) -> SeriesOutcome:
        """The outcome of a series sent again (``unsent``, or after a restart): its counts
        from the report the batch run wrote; not analysed in this pass."""
        from medrt.pacs.service import SeriesOutcome

        out = self.out / uid
        outcome = SeriesOutcome(uid, "unsent", out=out, analysed=False)
        try:
            counts = json.loads((out / "report.json").read_text(encoding="utf-8")).get("counts", {})
        except (OSError, ValueError, AttributeError):
            return outcome
        outcome.frames, outcome.lesions = int(counts.get("frames", 0)), int(counts.get("lesions", 0))
        outcome.errors, outcome.skipped = int(counts.get("errors", 0)), int(counts.get("skipped", 0))
        return outcome

    def _dispatch(self, state: SeriesState, outcome: SeriesOutcome, now: float | None) -> None:
        """Put a claimed series in the lane of each of its destinations (or finish it here:
        nowhere to send, or its results gone). ``now`` None: each lane reads the clock when
        it sends (a series may wait in a lane for minutes)."""
        uid = state.series_uid
        out = self.out / uid
        files = result_files(out)
        destinations, problems = self.destinations(state)
        outcome.destinations = [str(d) for d in destinations]
        if not files:  # the results folder was removed or emptied since: make them again
            outcome.state, outcome.detail = "receiving", f"no results in {out} to send; analysed again"
            log.warning("listener: series %s: %s", uid, outcome.detail)
            self.spool.mark(uid, "receiving", outcome.detail, unless_received_after=state.last_received)
            self._done(uid, outcome.timed())
            return
        digests = {p: (p.relative_to(out).as_posix(), sha256_file(p)) for p in files}
        job = _Sending(state, outcome, digests, left=len(destinations), problems=problems, delivered=set(files))
        if not destinations:
            self._finish(job)
            return
        for dest in destinations:
            outcome.sent[str(dest)] = 0
        with self._lock:
            self._sending[uid] = job
        for dest in destinations:
            lane = self._lanes.setdefault(str(dest), _Lane(str(dest)))
            lane.put(uid, lambda dest=dest: self._lane_job(job, dest, now))

    def _lane_job(self, job: _Sending, dest: AnyDestination, now: float | None) -> None:
        """In ``dest``'s lane: send it what it lacks of one series; the last lane to answer
        finishes the series."""
        uid = job.state.series_uid
        stopped = self._stop.is_set()
        if stopped:
            refused, why = list(job.digests), ""
        else:
            try:
                refused, why = self._deliver(uid, job.digests, dest, job.outcome, now)
            except Exception as exc:  # noqa: BLE001 - e.g. a result file unreadable: this series, not the lane
                refused, why = list(job.digests), f"{dest}: {describe_exception(exc)}"
                job.outcome.refused[str(dest)] = len(refused)
                if self._stop.is_set():  # e.g. the spool closed under a send that outlived the stop
                    stopped, why = True, ""
        with self._lock:
            job.delivered -= set(refused)
            job.stopped |= stopped
            if refused and why:
                job.problems.append(why)
                job.failed_at = max(job.failed_at, time.time() if now is None else now)
            job.left -= 1
            last = job.left == 0
        if last:
            self._finish(job)

    def _finish(self, job: _Sending) -> None:
        """Every destination of a series has answered: ``done``, ``unsent`` (with the
        reasons), or, stopped before it was all sent, ``analysed`` again. A send that
        outlived the stop's wait may end with the spool closed (``medrt listen`` closes it
        then): the series stays ``forwarding``, which the next start's recovery makes
        ``analysed``, so one warning says so (a traceback would alarm for nothing)."""
        uid, outcome = job.state.series_uid, job.outcome
        report = not job.stopped
        try:
            self._settle(job)
        except Exception as exc:
            if not self._stop.is_set():
                raise
            report = False
            log.warning("listener: series %s: stopped while it was being sent, and its state could not be "
                        "recorded (%s); the next start sends it", uid, describe_exception(exc))
        finally:
            self._done(uid, outcome.timed(), report=report)

    def _settle(self, job: _Sending) -> None:
        """Record what became of a series whose destinations have all answered."""
        uid, state, outcome = job.state.series_uid, job.state, job.outcome
        destinations = outcome.destinations
        outcome.forwarded = [p.name for p in job.digests if p in job.delivered and destinations]
        if job.stopped:
            outcome.state = "analysed"
            self.spool.mark(uid, "analysed", "stopped before it was all sent; sent at the next start",
                            unless_received_after=state.last_received)
            return
        if job.recalled:  # the spool has it "receiving" since the new images came
            outcome.state = "receiving"
            outcome.detail = f"new images came: analysed again before it was sent to {', '.join(job.recalled)}"
            log.info("listener: series %s: %s", uid, outcome.detail)
            return
        if job.problems:
            outcome.state, outcome.detail = "unsent", f"forwarding failed: {'; '.join(job.problems)}"
            log.error("listener: series %s: %s (sent again in %.0f s; results kept in %s)", uid,
                      outcome.detail, self.retry_s, outcome.out)
        else:
            outcome.state = "done"
        # an unsent series is due again --retry after its send failed (as the destination is
        # tried again then), not after it was claimed: the two clocks disagreed by the send's
        # length, so every other retry was "not tried" and the real interval was twice --retry
        if not self.spool.mark(uid, outcome.state, outcome.detail if job.problems else "",
                               unless_received_after=state.last_received,
                               attempted_at=job.failed_at if job.problems and job.failed_at else None):
            outcome.state = "receiving"  # more arrived meanwhile: analysed again once it is quiet
        elif outcome.state == "done":
            date_results(self.spool, uid, self.out / uid)
        log.info("listener: series %s %s: %d frame(s), %d lesion(s), %d error(s), %d sent to %s", uid,
                 outcome.state, outcome.frames, outcome.lesions, outcome.errors, len(outcome.forwarded),
                 ", ".join(destinations) or "-")

    def _done(self, uid: str, outcome: SeriesOutcome, *, report: bool = True) -> None:
        with self._lock:
            if uid not in self._sending:
                return  # finished already (a failure while finishing it)
            del self._sending[uid]
            if report and uid in self._wanted:
                self._finished[uid] = outcome
            self._wanted.discard(uid)
            self._lock.notify_all()
        if report and self.on_done is not None:
            self.on_done(outcome)

    def _deliver(self, uid: str, digests: dict[Path, tuple[str, str]], dest: AnyDestination,
                 outcome: SeriesOutcome, now: float | None) -> tuple[list[Path], str]:
        """Send ``dest`` those of the files (path → name, sha256) it does not hold yet, as the
        spool recorded; returns those it did not take, and why. A destination that took no
        association is not tried again, for any series, before ``retry_s`` has passed."""
        key = str(dest)
        start = time.time() if now is None else now
        held = self.spool.deliveries(uid, key)
        pending = [p for p, (name, digest) in digests.items() if held.get(name) != digest]
        if not pending:
            return [], ""
        down = self._unreachable.get(key)
        if down is not None and start < down[0]:
            outcome.refused[key] = len(pending)
            return pending, (f"{dest} not tried: it took nothing {start - down[0] + self.retry_s:.0f} s ago "
                             f"({down[1]}); tried again after --retry")
        why = ""
        try:
            if isinstance(dest, StowDestination):
                statuses = send_stow(pending, dest, timeout_s=self.timeout_s)
            else:
                statuses = send(pending, dest, calling_ae=self.calling_ae, tls=self.forward_tls,
                                timeout_s=self.timeout_s)
        except (ForwardError, OSError) as exc:
            statuses, why = getattr(exc, "statuses", {}), describe_exception(exc)
            if not statuses:  # not one reply: down, unreachable, or refusing us (no association, HTTP 4xx/5xx)
                failed = time.time() if now is None else now  # --retry counts from the failure, not the start
                self._unreachable[key] = (failed + self.retry_s, why)
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

    def destinations(self, state: SeriesState) -> tuple[list[AnyDestination], list[str]]:
        """Where a series' results go: every ``forward`` destination, then the sender's
        address with ``to_sender``; and what stands in the way: a sender with no address
        (no ``--peer`` for its AE title, or images indexed after a crash, whose sender is
        unknown). The other destinations are served all the same."""
        found = self._forward_list()
        problems = []
        if self.to_sender:
            dest = self.peers.get(state.calling_ae)
            if dest is None:
                problems.append(f"no address for the sender, AE {state.calling_ae or '(unknown)'}, to send the "
                                f"results back to (medrt listen --peer AET@HOST:PORT)")
            else:
                found.append(dest)
        return list(dict.fromkeys(found)), problems

    def _forward_list(self) -> list[AnyDestination]:
        forward = self.forward
        return [] if forward is None else [forward] if isinstance(forward, (Destination, StowDestination)) \
            else list(forward)
