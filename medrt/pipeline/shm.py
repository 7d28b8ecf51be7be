"""Results from worker processes through shared memory instead of the result pipe.

A worker process sends its :class:`~medrt.types.FrameResult` back through a pipe
by pickling it: a 512² CT slice's pixels and label map (1.5 MB) are copied by
pickle, through the pipe into the kernel and out again, and by unpickle, and the
parent process does half of that while it should be feeding the workers.
Measured on the 2-core machine (JPEG-LS 512² stream, two workers): ~100 fps as
pickled, ~114 fps when the arrays were not sent at all, which bounds what this
can win (with this module: ~112).

Here each worker keeps a few shared-memory *slots* of its own. It writes a
result's large arrays into a free slot, marks it busy, and returns only the
slot's name and the arrays' layout; the parent copies them out and marks the
slot free. Nothing is ever lost on the way: when every slot is busy, an array is
larger than the slot cap, or ``/dev/shm`` is full, that result goes back pickled
as before. The protocol is a one-byte flag per slot; the result's trip through
the worker's pipe orders the worker's writes before the parent's reads.

The standard library's ``multiprocessing.shared_memory`` does the mapping; no
library offers the slot reuse (a ``SharedMemoryManager`` would add a server
process and a round trip per block, and a fresh block per frame pays its page
faults every time).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from medrt.types import FrameResult

__all__ = ["Packed", "WorkerSlots", "ParentSlots", "SLOTS_PER_WORKER", "SLOT_CAP_BYTES"]

SLOTS_PER_WORKER = 4
SLOT_CAP_BYTES = 32 << 20  # a 2048² float32 frame and its labels; a 4096² radiograph goes pickled
MIN_BYTES = 64 << 10  # below this, pickling is as cheap as the slot bookkeeping
_HEADER = 64  # byte 0: 1 from the worker's write until the parent has copied the slot out
_ALIGN = 64


@dataclass(frozen=True, slots=True)
class _Ref:
    """Where one array of a packed result lies in its slot."""

    offset: int
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Packed:
    """Results whose arrays wait in shared-memory slot ``name`` (owner ``key``)."""

    key: tuple[int, int]  # (worker pid, slot index): a regrown slot replaces its old block
    name: str
    results: list[FrameResult]


def _arrays(r: FrameResult) -> list[tuple[str, str, np.ndarray]]:
    out = [("frame", "pixels", r.frame.pixels), ("result", "labels", r.labels)]
    if r.frame.color is not None:
        out.append(("frame", "color", r.frame.color))
    return out


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class WorkerSlots:
    """In a worker process: pack results into this worker's slots (:meth:`pack`)."""

    def __init__(self, count: int = SLOTS_PER_WORKER, cap_bytes: int = SLOT_CAP_BYTES,
                 min_bytes: int = MIN_BYTES) -> None:
        self.count, self.cap_bytes, self.min_bytes = count, cap_bytes, min_bytes
        self._slots: list[SharedMemory | None] = [None] * count

    def pack(self, results: list[FrameResult]) -> Packed | list[FrameResult]:
        """``results`` with their arrays moved into a free slot, or unchanged (to be
        pickled) when they are small, too large, or no slot is free."""
        arrays = [a for r in results for _, _, a in _arrays(r)]
        need = _HEADER + sum(_aligned(a.nbytes) for a in arrays)
        if need - _HEADER < self.min_bytes or need > self.cap_bytes:
            return results
        index = self._free_slot(need)
        if index is None:
            return results
        shm = self._slots[index]
        assert shm is not None
        offset = _HEADER
        packed = []
        for r in results:
            refs: dict[tuple[str, str], _Ref] = {}
            for owner, name, a in _arrays(r):
                a = np.ascontiguousarray(a)
                np.ndarray(a.shape, a.dtype, buffer=shm.buf, offset=offset)[...] = a
                refs[(owner, name)] = _Ref(offset, a.shape, a.dtype.str)
                offset += _aligned(a.nbytes)
            frame = dataclasses.replace(r.frame, **{n: ref for (o, n), ref in refs.items() if o == "frame"})
            packed.append(dataclasses.replace(r, frame=frame, labels=refs[("result", "labels")]))
        shm.buf[0] = 1
        return Packed((os.getpid(), index), shm.name, packed)

    def _free_slot(self, need: int) -> int | None:
        for i, shm in enumerate(self._slots):
            if shm is not None and shm.buf[0] == 0 and shm.size >= need:
                return i
        for i, shm in enumerate(self._slots):
            if shm is None or shm.buf[0] == 0:  # empty, or free but too small: (re)make it
                if shm is not None:
                    self._drop(shm)
                    self._slots[i] = None
                made = _create(max(need, 2 << 20))
                if made is None:
                    return None
                self._slots[i] = made
                return i
        return None

    @staticmethod
    def _drop(shm: SharedMemory) -> None:
        shm.close()
        try:
            shm.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Unmap this worker's slots (the parent unlinks them, :meth:`ParentSlots.close`)."""
        for shm in self._slots:
            if shm is not None:
                shm.close()
        self._slots = [None] * self.count


def _create(size: int) -> SharedMemory | None:
    """A new block of ``size`` bytes with its pages reserved, or None when /dev/shm is
    full: tmpfs allots pages on first touch, so without the reservation a full
    /dev/shm would kill the worker with SIGBUS in the middle of a write."""
    try:
        shm = SharedMemory(create=True, size=size)
    except OSError:
        return None
    fd = getattr(shm, "_fd", -1)
    if hasattr(os, "posix_fallocate") and fd >= 0:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            WorkerSlots._drop(shm)
            return None
    shm.buf[0] = 0
    return shm


class ParentSlots:
    """In the process that receives results: :meth:`unpack` copies arrays out of the
    workers' slots and frees them; :meth:`close` unlinks every slot it has seen."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], SharedMemory] = {}
        self._lock = threading.Lock()

    def unpack(self, payload: Packed | list[FrameResult]) -> list[FrameResult]:
        if not isinstance(payload, Packed):
            return payload
        shm = self._attach(payload)
        try:
            out = []
            for r in payload.results:
                frame_arrays = {f.name: self._copy(shm, getattr(r.frame, f.name))
                                for f in dataclasses.fields(r.frame) if isinstance(getattr(r.frame, f.name), _Ref)}
                frame = dataclasses.replace(r.frame, **frame_arrays)
                out.append(dataclasses.replace(r, frame=frame, labels=self._copy(shm, r.labels)))
            return out
        finally:
            shm.buf[0] = 0  # the worker may reuse the slot now

    @staticmethod
    def _copy(shm: SharedMemory, ref: Any) -> np.ndarray:
        return np.ndarray(ref.shape, np.dtype(ref.dtype), buffer=shm.buf, offset=ref.offset).copy()

    def _attach(self, payload: Packed) -> SharedMemory:
        with self._lock:
            shm = self._open.get(payload.key)
            if shm is not None and shm.name == payload.name:
                return shm
            if shm is not None:  # the worker regrew this slot and unlinked the old block
                shm.close()
            shm = SharedMemory(name=payload.name)
            # Python < 3.13 registers an attached block with the resource tracker as if
            # this process had made it; the tracker keeps one entry per name, and
            # close() below unlinks (and unregisters) it.
            self._open[payload.key] = shm
            return shm

    def close(self) -> None:
        """Unmap and unlink every slot seen; call after the workers have exited."""
        with self._lock:
            blocks, self._open = list(self._open.values()), {}
        for shm in blocks:
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

