"""Keep the objects that exist when a stream starts out of the cyclic garbage collector.

A full (generation 2) collection walks every tracked object. In a process that has
loaded a study, models and a GUI there are hundreds of thousands; in the viewer's test
process (660,000 after the rest of the suite) one such collection stopped every thread,
the Qt event loop included, for 370 ms in the middle of a 30 fps replay. While any
pipeline runs, :func:`hold` moves the objects alive at its start to the interpreter's
permanent generation (:func:`gc.freeze`: a list splice, no pause), so collections during
the stream walk only what the stream itself allocates. The last :func:`release`
undoes it (:func:`gc.unfreeze`).

Reference counting still frees every object the moment it is no longer used; only
reference cycles that were already garbage when the stream started wait until it ends.
Why not a library: this is two standard-library calls and a counter, shared by every
pipeline in the process (the viewer, ``medrt stream`` and the listener may run several).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["hold", "release", "holders"]

_lock = threading.Lock()
_holders = 0


def hold() -> None:
    """One more running stream: the first freezes the objects alive now."""
    global _holders
    with _lock:
        _holders += 1
        if _holders == 1:
            gc.freeze()


def release() -> None:
    """One stream fewer: the last unfreezes (their cycles are collected as usual again)."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


def holders() -> int:
    return _holders
