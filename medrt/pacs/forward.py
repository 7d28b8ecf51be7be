"""The listener's forwarder: a series' results to each destination, on a thread of its own.

The analysis worker (:class:`~medrt.pacs.service.PacsService`) writes a series' SEG, SR
and SC objects, marks it ``analysed`` in the spool and goes on to the next series. This
thread takes ``analysed`` series and sends their results to every destination: C-STORE
to a :class:`~medrt.pacs.scu.Destination`, STOW-RS to a
:class:`~medrt.pacs.stow.StowDestination`, and with ``to_sender`` back to the sender's
address in ``peers``. A PACS that is slow (minutes per object) or dead (a connect timeout
each time) delays only the sending, never the analysis of what scanners send next.

What a destination took is recorded in the spool by content (:meth:`Spool.record_deliveries`),
so a series that was not wholly taken (``unsent``, with the reason) is sent again after
``retry_s`` with only what each destination lacks, and without being analysed again. A
destination that took no association is not tried again for any series before
``retry_s`` has passed: a peer down costs one timeout per ``--retry``, not one per series.
The destinations of a series are sent to at once, each on a thread of its own, so that one
that is slow delays the others' copies not at all (it still delays the next series, which
is sent once every destination of this one has answered or timed out).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from medrt.engine.registry import sha256_file
from medrt.pacs.loop import BackgroundLoop
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


class Forwarder(BackgroundLoop):
    """Sends the results of ``analysed`` (and, after ``retry_s``, ``unsent``) series in
    ``spool``, found under ``out/<SeriesInstanceUID>/``, to ``forward`` and, with
    ``to_sender``, to the sender's address in ``peers``; hands each finished
    :class:`~medrt.pacs.service.SeriesOutcome` to ``on_done``."""

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
        # Destinations that took no association, and until when they are not tried again.
        self._unreachable: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._pending: dict[str, SeriesOutcome] = {}  # analysed here, with the analysis' counts and start
        self._sending: set[str] = set()

    # -- from the analysis worker ------------------------------------------------------------------------------

    def submit(self, outcome: SeriesOutcome) -> None:
        """A series the worker marked ``analysed``: send it at once (its outcome keeps the
        analysis' counts and start, so the line and the duration cover both)."""
        with self._lock:
            self._pending[outcome.series_uid] = outcome
        self.notify()

    def busy(self, series_uid: str) -> bool:
        """Whether this series' results are being sent now (the worker does not rewrite them
        meanwhile: an image that came during the send waits for the send to end)."""
        with self._lock:
            return series_uid in self._sending

    # -- one pass ----------------------------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> list[SeriesOutcome]:
        """Send every series due now; returns what became of each."""
        done = []
        for state in self.spool.to_send(retry_s=self.retry_s, now=now):
            if self._stop.is_set():
                break
            uid = state.series_uid
            with self._lock:
                self._sending.add(uid)
            try:
                if not self.spool.claim_send(uid, expect_received=state.last_received, now=now):
                    continue  # an image came since it was listed: analysed again first
                with self._lock:
                    outcome = self._pending.pop(uid, None)
                outcome = self._send(state, outcome or self._outcome(uid), time.time() if now is None else now)
            finally:
                with self._lock:
                    self._sending.discard(uid)
            done.append(outcome)
            if self.on_done is not None:
                self.on_done(outcome)
        return done

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

    def _send(self, state: SeriesState, outcome: SeriesOutcome, now: float) -> SeriesOutcome:
        uid = state.series_uid
        out = self.out / uid
        files = result_files(out)
        destinations, problems = self.destinations(state)
        outcome.destinations = [str(d) for d in destinations]
        if not files:  # the results folder was removed or emptied since: make them again
            outcome.state, outcome.detail = "receiving", f"no results in {out} to send; analysed again"
            log.warning("listener: series %s: %s", uid, outcome.detail)
            self.spool.mark(uid, "receiving", outcome.detail, unless_received_after=state.last_received)
            return outcome.timed()
        digests = {p: (p.relative_to(out).as_posix(), sha256_file(p)) for p in files}  # name, content
        delivered = set(files)
        for dest in destinations:
            outcome.sent[str(dest)] = 0
        for refused, why in self._deliver_all(uid, digests, destinations, outcome, now):
            delivered -= set(refused)
            if refused:
                problems.append(why)
        outcome.forwarded = [p.name for p in files if p in delivered and destinations]
        if problems:
            outcome.state, outcome.detail = "unsent", f"forwarding failed: {'; '.join(problems)}"
            log.error("listener: series %s: %s (sent again in %.0f s; results kept in %s)", uid, outcome.detail,
                      self.retry_s, out)
        else:
            outcome.state = "done"
        if not self.spool.mark(uid, outcome.state, outcome.detail if problems else "",
                               unless_received_after=state.last_received):
            outcome.state = "receiving"  # more arrived meanwhile: analysed again once it is quiet
        log.info("listener: series %s %s: %d frame(s), %d lesion(s), %d error(s), %d sent to %s", uid,
                 outcome.state, outcome.frames, outcome.lesions, outcome.errors, len(outcome.forwarded),
                 ", ".join(outcome.destinations) or "-")
        return outcome.timed()

    def _deliver_all(self, uid: str, digests: dict[Path, tuple[str, str]], destinations: list[AnyDestination],
                     outcome: SeriesOutcome, now: float) -> list[tuple[list[Path], str]]:
        """:meth:`_deliver` to every destination at once, one thread each, so that a slow or
        hung one (the archive) does not hold back what the others get (the reading room's
        workstation): each has its copy as soon as it has taken it. The series is finished
        once the last has answered or timed out. Results in the order of ``destinations``."""
        if len(destinations) < 2:
            return [self._deliver(uid, digests, dest, outcome, now) for dest in destinations]
        with ThreadPoolExecutor(max_workers=len(destinations), thread_name_prefix="medrt-forward-to") as pool:
            return list(pool.map(lambda dest: self._deliver(uid, digests, dest, outcome, now), destinations))

    def _deliver(self, uid: str, digests: dict[Path, tuple[str, str]], dest: AnyDestination,
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
                statuses = send_stow(pending, dest, timeout_s=self.timeout_s)
            else:
                statuses = send(pending, dest, calling_ae=self.calling_ae, tls=self.forward_tls,
                                timeout_s=self.timeout_s)
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

    def destinations(self, state: SeriesState) -> tuple[list[AnyDestination], list[str]]:
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
