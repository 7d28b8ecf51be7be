"""One background thread that runs ``run_once`` whenever woken, and at least every tick.

The listener's series worker (:class:`~medrt.pacs.service.PacsService`) and its storage
commitment reporter (:class:`~medrt.pacs.commitment.CommitmentReporter`) both work this
way: a pass over what is due, again when the listener says something arrived, and on a
timer for retries. A pass that raises is logged and the loop goes on (the index's disk
may come back), so one bad pass never stops the service.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["BackgroundLoop"]

log = logging.getLogger(__name__)


class BackgroundLoop:
    """Subclasses define :meth:`run_once`; ``thread_name`` names the thread and its log lines."""

    thread_name = "medrt-loop"

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
                try:
                    self.run_once()
                except Exception:  # noqa: BLE001 - e.g. the index's disk went away; log, keep serving
                    log.exception("%s: pass failed; trying again", self.thread_name)
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
