"""One background thread that runs ``run_once`` whenever woken, and at least every tick.

The listener's series worker (:class:`~medrt.pacs.service.PacsService`) and its storage
commitment reporter (:class:`~medrt.pacs.commitment.CommitmentReporter`) both work this
way: a pass over what is due, again when the listener says something arrived, and on a
timer for retries. A pass that raises is logged and the loop goes on (the index's disk
may come back), so one bad pass never stops the service. The same failure again is
logged with its traceback once, then once a minute with a count (a full disk failed every
pass, twice a second, each with a traceback); :attr:`failing` says what fails, for the
health page, until a pass succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["BackgroundLoop"]

log = logging.getLogger(__name__)


class BackgroundLoop:
    """Subclasses define :meth:`run_once`; ``thread_name`` names the thread and its log lines."""

    thread_name = "medrt-loop"

    #: Seconds between log lines for a failure that repeats.
    repeat_log_s = 60.0

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # (what failed, since when, passes failed, when last logged), while passes fail
        self._failing: tuple[str, float, int, float] | None = None

    @property
    def failing(self) -> str:
        """What the last pass failed on and since when ("" while passes succeed)."""
        if self._failing is None:
            return ""
        what, since, count, _ = self._failing
        return f"{what} (since {time.strftime('%H:%M:%S', time.localtime(since))}, {count} pass(es))"

    def _pass(self) -> None:
        """One :meth:`run_once`; a failure is logged (repeats rarely) and remembered."""
        try:
            self.run_once()
        except Exception as exc:  # noqa: BLE001 - e.g. the index's disk went away; log, keep serving
            what = f"{type(exc).__name__}: {exc}"
            now = time.time()
            if self._failing is None or self._failing[0] != what:
                log.exception("%s: pass failed; trying again", self.thread_name)
                self._failing = (what, now, 1, now)
                return
            _, since, count, logged = self._failing
            if now - logged >= self.repeat_log_s:
                log.error("%s: passes still failing (%d since %s): %s", self.thread_name, count + 1,
                          time.strftime("%H:%M:%S", time.localtime(since)), what)
                logged = now
            self._failing = (what, since, count + 1, logged)
        else:
            if self._failing is not None:
                log.warning("%s: passes succeed again (after %d failed)", self.thread_name, self._failing[2])
            self._failing = None

    def run_once(self, now: float | None = None) -> Any:  # pragma: no cover - defined by subclasses
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        """Whether the thread runs (started, not stopped, not dead)."""
        return self._thread is not None and self._thread.is_alive()

    def notify(self, *_: object) -> None:
        """Something arrived: run a pass at once rather than at the next tick."""
        self._wake.set()

    def start(self, tick_s: float = 0.5) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self._pass()
                self._wake.wait(tick_s)
                self._wake.clear()

        self._thread = threading.Thread(target=loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
