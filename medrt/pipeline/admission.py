"""How many source items a pipeline lets past its entry at once (``Pipeline(max_in_flight=...)``).

A pipeline that cannot keep up with a live source should leave its backlog in the
entry queue, where the entry's policy applies (``latest`` drops the oldest there),
and not in the inner queues, which block and would each hold ``depth`` stale frames
that still reach the screen, late. :class:`Credits` is that bound: the first stage
takes a credit before it takes an item, and the item gives it back when its last
output leaves the in-order delivery (a result, an error, an empty fan-out, a gap).
:func:`live_in_flight` is the bound the faces use by default.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from medrt.pipeline.queues import Policy

__all__ = ["Credits", "live_in_flight"]


def live_in_flight(policy: Policy | str, stages: Sequence[Any], requested: int | None = None) -> int | None:
    """The ``max_in_flight`` for an entry ``policy`` over ``stages``: ``requested`` when
    given (0: unbounded, as ``--max-in-flight 0``); else, with ``latest`` (a live view
    keeping up with its scanner), the widest stage's workers + 2 (each of them busy, one
    frame decoded ahead, one being finished), which kept the stages as busy as unbounded
    (measured: ``medrt bench --only stream``) while a backlog stays at the entry to be
    dropped; other policies (a batch, a listener: nothing may be dropped): None, unbounded."""
    if requested is not None:
        return requested or None
    if Policy.parse(policy) is not Policy.LATEST:
        return None
    return max(s.workers for s in stages) + 2


class Credits:
    """At most ``limit`` items between the first stage and the sinks, by item ``seq``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = threading.Semaphore(limit)
        self._lock = threading.Lock()
        self._held: set[int] = set()  # seqs holding a credit (one dropped at the entry never held one)

    def take(self, aborted: Callable[[], bool]) -> bool:
        """Wait for a free credit; False once ``aborted()`` says to stop waiting."""
        while not self._free.acquire(timeout=0.1):
            if aborted():
                return False
        return True

    def hold(self, seq: int) -> None:
        """The credit just taken now belongs to the item ``seq``."""
        with self._lock:
            self._held.add(seq)

    def give_back(self) -> None:
        """Return a credit taken for no item (the first stage met the end sentinel)."""
        self._free.release()

    def done(self, seq: int) -> None:
        """The item ``seq`` has left the delivery: its credit, if it held one, is free."""
        with self._lock:
            if seq not in self._held:
                return
            self._held.discard(seq)
        self._free.release()

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)
