"""Sinks that never hold up inference: a ring buffer a viewer polls, and a callback adapter.

The pipeline calls sinks on its own sink thread, so a slow sink can only delay
other sinks, and with a ``block`` edge before the sink thread, back-pressure the
pipeline. A viewer must never do that: :class:`RingBuffer` only appends to a
bounded deque (O(1), never waits), and the GUI takes the newest results on its
own timer.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from medrt.pipeline.graph import Envelope, FrameError

__all__ = ["RingBuffer", "CallbackSink"]


class RingBuffer:
    """Keeps the newest ``capacity`` results (and errors); older ones fall off and are counted."""

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f'Argument "capacity" must be >= 1, got {capacity!r}.')
        self._items: deque[Any] = deque(maxlen=capacity)
        self._errors: deque[FrameError] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._new = threading.Condition(self._lock)
        self.received = 0
        self.overwritten = 0
        self.closed = False

    def on_result(self, payload: Any, envelope: Envelope) -> None:
        with self._lock:
            if len(self._items) == self._items.maxlen:
                self.overwritten += 1
            self._items.append(payload)
            self.received += 1
            self._new.notify_all()

    def on_error(self, error: FrameError, envelope: Envelope) -> None:
        with self._lock:
            self._errors.append(error)
            self._new.notify_all()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._new.notify_all()

    def latest(self) -> Any | None:
        """The newest result, or None; it stays in the buffer."""
        with self._lock:
            return self._items[-1] if self._items else None

    def drain(self) -> list[Any]:
        """Every buffered result, oldest first, emptying the buffer."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            return items

    def errors(self) -> list[FrameError]:
        with self._lock:
            errs = list(self._errors)
            self._errors.clear()
            return errs

    def wait(self, timeout: float | None = None) -> bool:
        """Block (the caller, never the pipeline) until a result arrives or the stream ends."""
        with self._lock:
            if self._items or self.closed:
                return True
            return self._new.wait(timeout)


class CallbackSink:
    """Adapts plain functions to the sink interface: ``on_result(payload)`` and
    ``on_error(error)``; keep them quick (post to a GUI event loop, append to a list)."""

    def __init__(self, on_result: Callable[[Any], None], on_error: Callable[[FrameError], None] | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self._on_result = on_result
        self._on_error = on_error
        self._on_close = on_close

    def on_result(self, payload: Any, envelope: Envelope) -> None:
        self._on_result(payload)

    def on_error(self, error: FrameError, envelope: Envelope) -> None:
        if self._on_error is not None:
            self._on_error(error)

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close()
