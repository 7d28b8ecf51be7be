"""Bounded queues whose behaviour when full is part of the wiring (Holoscan's idea).

``block``  waits for room: nothing is ever dropped (batch, listener).
``latest`` drops the oldest queued item to make room: the consumer always gets
           the newest frames and never falls behind (viewer).
``reject`` refuses the new item and counts it (admission control).

The end-of-stream sentinel is always accepted, even into a full queue, so a
shutdown can never deadlock or be dropped.
"""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Policy", "EndOfStream", "END", "QueueClosed", "BoundedQueue"]


class Policy(str, enum.Enum):
    BLOCK = "block"
    LATEST = "latest"
    REJECT = "reject"

    @classmethod
    def parse(cls, value: Policy | str) -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"queue policy must be one of {[p.value for p in cls]}, got {value!r}") from None


class EndOfStream:
    """The one object that means "no more items" (never a string like 'end')."""

    _instance: EndOfStream | None = None

    def __new__(cls) -> EndOfStream:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<end of stream>"


END = EndOfStream()


class QueueClosed(RuntimeError):
    """The queue was closed (pipeline aborted) while waiting on it."""


class BoundedQueue:
    """A thread-safe FIFO of at most ``maxsize`` items with a policy for when it is full.

    ``on_discard(item)`` is called (outside the lock) for every item that a
    ``latest`` queue drops or a ``reject`` queue refuses, so the owner can account
    for it (the pipeline keeps results in order past such gaps).
    """

    def __init__(self, name: str, maxsize: int, policy: Policy | str = Policy.BLOCK,
                 on_discard: Callable[[Any], None] | None = None) -> None:
        if maxsize < 1:
            raise ValueError(f'Argument "maxsize" must be >= 1, got {maxsize!r}.')
        self.name = name
        self.policy = Policy.parse(policy)
        self._maxsize = int(maxsize)
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._closed = False
        self._on_discard = on_discard
        self.drops = 0
        self.rejects = 0
        self.max_depth = 0
        self.puts = 0

    # -- introspection --------------------------------------------------------

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def resize(self, maxsize: int) -> None:
        """Change the capacity (items already queued beyond it stay; new ones wait)."""
        if maxsize < 1:
            raise ValueError(f'Argument "maxsize" must be >= 1, got {maxsize!r}.')
        with self._lock:
            self._maxsize = int(maxsize)
            self._not_full.notify_all()

    # -- producer side ----------------------------------------------------------

    def put(self, item: Any, timeout: float | None = None) -> bool:
        """Queue ``item`` by the policy. Returns False when it was refused (``reject``,
        or ``block`` past ``timeout``). Raises :class:`QueueClosed` after ``close()``."""
        discarded = None
        with self._lock:
            if self._closed:
                raise QueueClosed(self.name)
            if item is END:
                self._append(item)
                return True
            if len(self._items) >= self._maxsize:
                if self.policy is Policy.REJECT:
                    self.rejects += 1
                    discarded = item
                elif self.policy is Policy.LATEST:
                    discarded = self._pop_oldest_item()
                else:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    while len(self._items) >= self._maxsize and not self._closed:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            return False
                        self._not_full.wait(left)
                    if self._closed:
                        raise QueueClosed(self.name)
            if discarded is not item:
                self._append(item)
        if discarded is not None and self._on_discard is not None:
            self._on_discard(discarded)
        return discarded is not item

    def _append(self, item: Any) -> None:
        self._items.append(item)
        self.puts += 1
        self.max_depth = max(self.max_depth, len(self._items))
        self._not_empty.notify()

    def _pop_oldest_item(self) -> Any:
        # Never drop the sentinel: find the oldest real item.
        for i, queued in enumerate(self._items):
            if queued is not END:
                del self._items[i]
                self.drops += 1
                return queued
        return None  # pragma: no cover - a full queue of sentinels cannot happen

    # -- consumer side ------------------------------------------------------------

    def get(self, timeout: float | None = None) -> Any:
        """The oldest item; raises ``TimeoutError`` after ``timeout`` seconds and
        :class:`QueueClosed` once closed and empty."""
        with self._lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._items:
                if self._closed:
                    raise QueueClosed(self.name)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(self.name)
                self._not_empty.wait(left)
            item = self._items.popleft()
            self._not_full.notify()
            return item

    def close(self) -> None:
        """Wake every waiter; later puts raise and gets drain what is left, then raise."""
        with self._lock:
            self._closed = True
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def __repr__(self) -> str:
        return f"BoundedQueue({self.name!r}, {len(self)}/{self._maxsize}, {self.policy.value})"
