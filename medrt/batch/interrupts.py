"""Ctrl-C and SIGTERM held off while a batch writes its results and report.

A batch stops on Ctrl-C, or on SIGTERM turned into one
(:func:`medrt.commands.options.sigterm_as_interrupt`), keeping every finished series
and writing its results and report. One that lands once the series are done (systemd
stops the unit as the last one finishes; a second Ctrl-C from someone who thinks the
first was missed) used to cut that writing short: ``medrt: interrupted`` and no report.
Within :class:`DeferredInterrupts` the signal is noted instead, the writing finishes,
and the caller ends the run as interrupted (exit 130).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["DEFERRED_SIGNALS", "DeferredInterrupts"]

DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DeferredInterrupts:
    """A context in which SIGINT and SIGTERM are noted, not acted on; the handlers that
    were there come back on exit. ``received`` names the first signal that arrived
    (``"SIGTERM"``), or is None.

    Signals reach Python's main thread only, so elsewhere (a GUI's worker thread) it
    does nothing: no interrupt can land there anyway.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        # Only an attribute set here: a handler runs between any two bytecodes of the
        # main thread, possibly inside logging's own lock.
        if self.received is None:
            self.received = signal.Signals(signum).name

    def __enter__(self) -> DeferredInterrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in DEFERRED_SIGNALS:
                # An ignored signal stays ignored: a batch started in the background of a
                # script (SIGINT ignored, inherited) must not end as interrupted on a Ctrl-C
                # meant for the script's foreground, only because it came while writing.
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            # None: a handler not set from Python; the default is the nearest there is
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
