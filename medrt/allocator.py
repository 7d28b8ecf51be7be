"""glibc's malloc, told to give freed memory back.

glibc gives each thread that allocates concurrently an arena of its own, up to eight per
core, and an arena keeps the pages it once held: onnxruntime's and numpy's buffers freed by
a series' pipeline threads stay in the process. A process that makes thread pools again and
again (the listener and the batch make one per series, the viewer one per series opened, a
test run one per test) grows with every pool until the machine runs out (README,
Performance: a pytest run of two test files was killed for memory on a 24 GiB machine).
Capping the arenas (``mallopt(M_ARENA_MAX)``, as the ``MALLOC_ARENA_MAX`` environment
variable does) keeps that memory bounded; :func:`trim` hands free pages back to the system.

Both are no-ops elsewhere than on glibc (musl, macOS, Windows have neither call), and
``MALLOC_ARENA_MAX`` in the environment wins: an operator who set it chose.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# mallopt's parameter number for the arena cap (glibc's malloc.h: #define M_ARENA_MAX -8).
_M_ARENA_MAX = -8

# Two arenas: over 25 series the listener grew +10.9 % with two against +21.7 % with glibc's
# default, and a test file that reached 10 GB peaked at 1.5 GB, at no cost in throughput
# that this noisy machine could show (README, Performance; docs/performance-log.md, session 41).
DEFAULT_ARENAS = 2

_libc: ctypes.CDLL | None = None
_looked = False


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    global _libc, _looked
    if not _looked:
        _looked = True
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            lib = None
        if lib is not None and hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            _libc = lib
    return _libc


def limit_arenas(n: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``n`` unless ``MALLOC_ARENA_MAX`` is set; True when
    capped here. Called before threads start: arenas made before stay. The variable is
    then set too, so that the processes started from here (the pipeline's decode and
    analysis workers, which do not pass through this call) have the same cap from their
    first allocation."""
    if n < 1:
        raise ValueError(f'Argument "n" must be at least 1, not {n}.')
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    lib = _glibc()
    if lib is None:
        return False
    if lib.mallopt(_M_ARENA_MAX, n) != 1:  # mallopt returns 1 on success
        log.debug("malloc: mallopt(M_ARENA_MAX, %d) refused", n)
        return False
    os.environ["MALLOC_ARENA_MAX"] = str(n)
    return True


def trim() -> bool:
    """Give the free pages of every arena back to the system (``malloc_trim(0)``); True
    when glibc returned some."""
    lib = _glibc()
    return bool(lib is not None and lib.malloc_trim(0))
