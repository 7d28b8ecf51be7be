"""The Ray actor each node runs for ``medrt batch --ray``: the models loaded once, then a
series at a time through :func:`medrt.batch.run_batch`, its bytes in and its finished
folder out through Ray's object store (no shared file system)."""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from medrt import __version__
from medrt.batch.outputs import OutputOptions
from medrt.batch.plan import MANIFEST
from medrt.batch.run import BatchConfig, _settings, run_batch
from medrt.engine.hardware import cpu_layout, cpu_name, on_gpu
from medrt.io.atomic import atomic_write_bytes

__all__ = ["SeriesWorker", "safe_relative"]


class SeriesWorker:
    """A Ray actor: the models loaded once, then one series at a time through run_batch."""

    def __init__(self, analyzer_config: Any, outputs: OutputOptions, cpus: float, workers: int | None,
                 decode_workers: int, log_level: int = logging.WARNING) -> None:
        from medrt.analyzer import load_analyzer
        from medrt.privacy import setup_console_logging

        # the driver's level (--quiet: errors only; -v more): Ray prints a worker's log on the
        # driver's console, redacted here as medrt.cli redacts its own
        setup_console_logging(log_level, "%(levelname)s %(name)s: %(message)s")
        logging.getLogger().setLevel(log_level)
        threads, self.workers = cpu_layout(int(cpus), gpu=on_gpu(analyzer_config.backend, analyzer_config.device),
                                           workers=workers)
        if analyzer_config.threads is None and threads is not None:
            analyzer_config = replace(analyzer_config, threads=threads)
        self.analyzer = load_analyzer(analyzer_config)
        self.outputs = outputs
        self.decode_workers = decode_workers
        self.cpus = cpus

    def describe(self) -> dict[str, Any]:
        import ray

        return {"medrt": __version__, "settings": _settings(self.analyzer, self.outputs),
                "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "pid": os.getpid(), "processor": cpu_name(), "cpus": self.cpus, "workers": self.workers,
                "backend": self.analyzer.backend_name, "precision": self.analyzer.precision,
                "models": list(self.analyzer.models)}

    def refusal(self, modality: str | None, sop_class_uid: str | None, image_type: tuple[str, ...] = (),
                body_part: str = "", view: str = "", plane: str = "") -> str | None:
        return self.analyzer.refusal(modality, sop_class_uid=sop_class_uid, image_type=image_type,
                                     body_part=body_part, view=view, plane=plane)

    def analyse(self, files: list[tuple[str, bytes]], root: str) -> dict[str, Any]:
        """Analyse one series, given as (path relative to the input folder, bytes) pairs;
        return its finished folder as {relative path: bytes} and where it ran. ``root`` is
        the input folder on the driver: a reason that quotes a file's path names it there,
        not in this worker's temporary copy."""
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="medrt-ray-") as tmp:
            inp, out = Path(tmp) / "in", Path(tmp) / "out"
            for rel, data in files:
                atomic_write_bytes(inp / safe_relative(rel), data)
            run_batch(BatchConfig(input=inp, out=out, workers=self.workers, decode_workers=self.decode_workers,
                                  outputs=self.outputs), analyzer=self.analyzer)
            folders = [d for d in (out / "series").iterdir() if d.is_dir()] if (out / "series").is_dir() else []
            if len(folders) != 1:
                raise RuntimeError(f"the worker found {len(folders)} series in the files it was sent, not 1")
            folder = folders[0]
            if not (folder / MANIFEST).is_file():
                raise RuntimeError("the worker's run did not finish the series")
            sent = {p.relative_to(folder).as_posix(): p.read_bytes()
                    for p in sorted(folder.rglob("*")) if p.is_file()}
            sent[MANIFEST] = _rehome(sent[MANIFEST], inp, root)
        import ray

        return {"files": sent, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "seconds": time.perf_counter() - t0}


def _rehome(manifest: bytes, here: Path, root: str) -> bytes:
    """The manifest with the notes' reasons quoting ``root`` where they quote ``here``."""
    data = json.loads(manifest)
    for note in data.get("notes", []):
        note["reason"] = note["reason"].replace(str(here), root)
    return json.dumps(data, indent=1).encode()


def safe_relative(rel: str) -> PurePosixPath:
    """``rel`` as a path that stays inside the folder it is joined to."""
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or ".." in p.parts:
        raise ValueError(f"{rel!r} is not a relative path inside the series")
    return p
