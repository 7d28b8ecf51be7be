"""Worker processes for the pipeline's CPU-bound stages, each serving a few pipes.

Why not ``concurrent.futures.ProcessPoolExecutor`` (what this replaced):

- **Blame.** When one worker dies, the executor fails every pending task. A file
  that was only queued behind the one that crashed its worker was reported as
  crashing too, so a batch lost good files next to a bad one. Here each worker
  publishes which of its pipes it is serving; the task on that pipe is the one
  that crashed, and a task that was only queued is sent again to the fresh worker.
- **Hops.** Every executor task passes through two helper threads in the calling
  process (its manager thread and the call queue's feeder) before a worker sees
  it, and back through the manager thread. With both cores busy in the workers,
  those wake-ups were a good part of the ~1.9 ms the parent spent per 512² CT
  slice. Here the thread that asks writes to its pipe and reads the reply itself.

Each worker serves ``channels`` duplex pipes, one per calling thread, so it has
the next task waiting while it sends a result back. Workers start by forkserver
(never fork a process that already runs ORT threads), ignore SIGINT (the parent
decides when to stop) and run ``initializer`` once before the first task.
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from medrt.errors import CorruptPixelDataError

__all__ = ["WorkerPool", "WorkerStartError"]

log = logging.getLogger(__name__)

_IDLE = -1


class WorkerStartError(RuntimeError):
    """A worker process could not run its initializer (for example, a model failed to load)."""


class _Closed:
    """Handed to a thread still waiting for a pipe when the pool closes."""


_CLOSED = _Closed()


def _serve(conns: list[Connection], busy: Any, initializer: Callable[..., None] | None,
           initargs: tuple[Any, ...], log_level: int = logging.WARNING) -> None:
    """A worker's main loop: answer ``(fn, arg)`` on any pipe with ``(ok, value)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The parent's logging, redaction included: a fresh process has none, and pydicom's
    # warnings came out raw (a header value in quotes, a source line), even with --quiet.
    from medrt.privacy import setup_console_logging

    setup_console_logging(log_level)
    try:
        if initializer is not None:
            initializer(*initargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        failure = WorkerStartError(f"worker process failed to start: {type(exc).__name__}: {exc}")
        for c in conns:
            c.send((False, failure))
        return
    for c in conns:
        c.send((True, None))  # ready
    live = list(conns)
    while live:
        for c in wait(live):
            try:
                msg = c.recv()
            except EOFError:
                msg = None
            if msg is None:
                live.remove(c)
                continue
            fn, arg = msg
            busy.value = conns.index(c)
            try:
                reply = (True, fn(arg))
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                reply = (False, exc)
            try:
                c.send(reply)
            except Exception as exc:  # noqa: BLE001 - a result or error that cannot be pickled
                c.send((False, RuntimeError(f"worker could not send its reply: {type(exc).__name__}: {exc}")))
            busy.value = _IDLE


@dataclass(eq=False)
class _Worker:
    process: Any
    conns: list[Connection]
    busy: Any  # shared int: the pipe being served, or _IDLE


class WorkerPool:
    """``processes`` worker processes, started on first use (or :meth:`start`) and
    each replaced when it dies. :meth:`call` runs ``fn(arg)`` in one of them.

    A worker that dies in the middle of a task costs that task only: it raises
    :class:`~medrt.errors.CorruptPixelDataError` naming ``item`` with
    :attr:`crash_reason`, and tasks queued on the same worker run on its
    replacement. :meth:`close` stops the workers; a later call starts new ones.
    """

    crash_reason = "a worker process crashed on this file"

    def __init__(self, processes: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = (), *, channels: int = 2) -> None:
        if processes < 1:
            raise ValueError(f'Argument "processes" must be >= 1, got {processes!r}.')
        if channels < 1:
            raise ValueError(f'Argument "channels" must be >= 1, got {channels!r}.')
        self.processes, self.channels = processes, channels
        self._init = (initializer, initargs)
        self._ctx = multiprocessing.get_context("forkserver")
        self._workers: list[_Worker] | None = None
        self._free: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """True while worker processes are up."""
        return self._workers is not None

    def start(self) -> None:
        """Start every worker and run its initializer now; a failure raises
        :class:`WorkerStartError` here rather than at the first task."""
        with self._lock:
            if self._workers is not None:
                return
            workers = [self._spawn() for _ in range(self.processes)]
            try:
                for w in workers:
                    self._handshake(w)
            except BaseException:
                for w in workers:
                    self._kill(w)
                raise
            self._workers = workers
            self._free = queue.Queue()
            for i in range(self.processes):
                for c in range(self.channels):
                    self._free.put((i, c))

    def _spawn(self) -> _Worker:
        pairs = [self._ctx.Pipe(duplex=True) for _ in range(self.channels)]
        busy = self._ctx.RawValue("i", _IDLE)
        initializer, initargs = self._init
        proc = self._ctx.Process(target=_serve, args=([child for _, child in pairs], busy, initializer, initargs,
                                                      logging.getLogger().getEffectiveLevel()),
                                 name="medrt-worker", daemon=True)
        proc.start()
        for _, child in pairs:
            child.close()
        return _Worker(proc, [parent for parent, _ in pairs], busy)

    @staticmethod
    def _handshake(w: _Worker) -> None:
        for conn in w.conns:
            try:
                ok, value = conn.recv()
            except (EOFError, OSError):
                raise WorkerStartError(f"worker process exited while starting (exit code {w.process.exitcode})") from None
            if not ok:
                raise value

    @staticmethod
    def _kill(w: _Worker) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join(5.0)
        for conn in w.conns:
            conn.close()

    def _replace(self, index: int, dead: _Worker) -> None:
        with self._lock:
            if self._workers is None or self._workers[index] is not dead:
                return  # closed, or another thread already replaced it
            self._kill(dead)
            fresh = self._spawn()
            self._handshake(fresh)
            self._workers[index] = fresh

    def call(self, fn: Callable[[Any], Any], arg: Any, item: Any) -> Any:
        """``fn(arg)`` in a worker; ``item`` names the input if the worker dies on it.
        ``fn``, ``arg``, the result and any exception must pickle."""
        if self._workers is None:
            self.start()
        free = self._free
        key = free.get()
        if key is _CLOSED:
            free.put(key)
            raise RuntimeError("the worker pool was closed")
        try:
            return self._call(key, fn, arg, item)
        finally:
            free.put(key)

    def _call(self, key: tuple[int, int], fn: Callable[[Any], Any], arg: Any, item: Any) -> Any:
        index, channel = key
        for attempt in range(2):
            workers = self._workers
            if workers is None:
                raise RuntimeError("the worker pool was closed")
            w = workers[index]
            conn = w.conns[channel]
            try:
                conn.send((fn, arg))
                ok, value = conn.recv()
            except (EOFError, OSError):
                if self._workers is None:
                    raise RuntimeError("the worker pool was closed") from None
                mine = w.busy.value == channel  # the worker was on this task when it died
                w.process.join(1.0)
                log.warning("worker process %s exited (code %s); starting another",
                            w.process.pid, w.process.exitcode)
                self._replace(index, w)
                if mine or attempt:
                    raise CorruptPixelDataError(item, self.crash_reason) from None
                continue  # it was only queued there: run it on the replacement
            if ok:
                return value
            raise value
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self, timeout: float = 30.0) -> None:
        """Stop the workers once the tasks in flight finish (at most ``timeout``
        seconds, then they are killed)."""
        with self._lock:
            workers, self._workers = self._workers, None
            free = self._free
        if workers is None:
            return
        deadline = time.monotonic() + timeout
        for _ in range(len(workers) * self.channels):  # wait for the tasks in flight
            try:
                free.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
        free.put(_CLOSED)  # anyone still waiting for a pipe gives up
        for w in workers:
            for conn in w.conns:
                try:
                    conn.send(None)
                except OSError:
                    pass
        for w in workers:
            w.process.join(max(0.1, deadline - time.monotonic()))
            self._kill(w)
