"""What a batch run will do: the input files grouped into series, what is skipped and why,
and which series an earlier run already finished with the same content and settings."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medrt.engine.registry import sha256_file as file_sha256
from medrt.io.scan import iter_files
from medrt.io.series import Series, SeriesItem, group_series

__all__ = ["Note", "SeriesPlan", "Plan", "scan", "file_sha256", "settings_key", "finished", "paths_of", "MANIFEST",
           "series_notes"]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"  # written last in a series folder: its presence means "finished"


@dataclass(frozen=True, slots=True)
class Note:
    """One row of errors.csv: an input that was not analysed (``kind`` "error"), or was
    passed over on purpose (``kind`` "skipped": not DICOM, not an image, a duplicate)."""

    file: str
    kind: str
    stage: str
    reason: str
    sop_instance_uid: str = ""

    def as_row(self) -> dict[str, str]:
        return {"file": self.file, "kind": self.kind, "stage": self.stage, "reason": self.reason,
                "sop_instance_uid": self.sop_instance_uid}


@dataclass(frozen=True, slots=True)
class SeriesPlan:
    """One series to analyse: its files in slice order and the hash of their content."""

    series: Series
    paths: tuple[Path, ...]
    frames: dict[str, int]  # str(path) -> frames it holds
    content_sha256: str
    folder_name: str

    @property
    def uid(self) -> str:
        return self.series.series_instance_uid

    @property
    def n_frames(self) -> int:
        return sum(self.frames.values())


@dataclass
class Plan:
    root: Path
    series: list[SeriesPlan]
    notes: list[Note] = field(default_factory=list)
    files_seen: int = 0


def relative(path: Path, root: Path) -> str:
    """``path`` as errors.csv and results.jsonl name it: relative to the input folder."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def scan(root: Path, *, exclude: Path | None = None, follow_links: bool = False) -> Plan:
    """Walk ``root`` (recursively; links that leave it are not followed unless
    ``follow_links``), read headers only, and group the images into series.
    Files under ``exclude`` (the output folder, when it sits inside the input) are ignored."""
    root = Path(root)
    outside: list[Path] = []
    files = [p for p in iter_files([root], follow_outside_links=follow_links, not_followed=outside)
             if exclude is None or not _inside(p, exclude)]
    grouped = group_series(files, dicomdir=False)  # a DICOMDIR given as root is expanded above, once
    base = root if root.is_dir() else root.parent
    notes: list[Note] = [Note(relative(p, base), "skipped", "scan", "a symbolic link that leads outside INPUT: "
                              "not followed (--follow-links follows it)") for p in outside]
    for bad in grouped.errors:
        error = bad.error
        skippable = bool(getattr(error, "skippable", False))
        notes.append(Note(relative(Path(bad.source), base), "skipped" if skippable else "error", "scan",
                          error.why))
    for ni in grouped.non_images:
        notes.append(Note(relative(Path(ni.source), base), "skipped", "scan", f"not an image ({ni.kind})",
                          ni.sop_instance_uid))
    plans: list[SeriesPlan] = []
    names: set[str] = set()
    for series in grouped.series:
        kept = {item.sop_instance_uid: item for item in series.items}
        placed = [item for item in series.items if item.position is not None]
        for dup in series.duplicates_dropped:
            copy_of = kept.get(dup.sop_instance_uid) if dup.sop_instance_uid else None
            if copy_of is not None:  # the same instance twice (a re-sent or copied file)
                reason = (f"another copy of an image of the series (same SOPInstanceUID); "
                          f"{_name(copy_of, base)} was kept")
            else:  # another image at the same place (a re-acquisition, a second reconstruction)
                twin = (min(placed, key=lambda i: abs(i.position - dup.position))  # type: ignore[operator]
                        if placed and dup.position is not None else None)
                reason = ("same slice position as " + (_name(twin, base) if twin else "another image of the series")
                          + ", which was kept (the higher AcquisitionNumber, then InstanceNumber, then the "
                          "file met later is kept)")
            notes.append(Note(_name(dup, base), "skipped", "scan", reason, dup.sop_instance_uid))
        paths = tuple(item.path for item in series.items if item.path is not None)
        frames = {str(item.path): item.frames for item in series.items if item.path is not None}
        h = hashlib.sha256()
        for p in sorted(paths):
            h.update(os.fsencode(relative(p, base)) + b"\0" + file_sha256(p).encode() + b"\n")
        name = series.series_instance_uid
        if name in names:  # the same series UID in two studies
            name = f"{name}-{hashlib.sha256(series.study_instance_uid.encode()).hexdigest()[:8]}"
        names.add(name)
        plans.append(SeriesPlan(series, paths, frames, h.hexdigest(), name))
    plans.sort(key=lambda sp: relative(min(sp.paths), base) if sp.paths else sp.uid)
    return Plan(base, plans, notes, len(files))


def _name(item: SeriesItem, base: Path) -> str:
    """A series item for a note: its file relative to ``base``, else its SOPInstanceUID."""
    return relative(item.path, base) if item.path else item.sop_instance_uid


def series_notes(sp: SeriesPlan, root: Path, kind: str, stage: str, reason: str) -> list[Note]:
    """One errors.csv row per file of ``sp``, each with its SOPInstanceUID."""
    sops = {str(item.path): item.sop_instance_uid for item in sp.series.items}
    return [Note(relative(p, root), kind, stage, reason, sops.get(str(p), "")) for p in sp.paths]


def settings_key(settings: Mapping[str, Any]) -> str:
    """A hash of everything that changes a series' results (models, mode, precision …)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def finished(folder: Path, plan: SeriesPlan, key: str) -> dict[str, Any] | None:
    """The manifest of ``folder`` when it records this series' content and settings, else None."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if manifest.get("content_sha256") == plan.content_sha256 and manifest.get("settings_key") == key:
        return manifest
    return None


def paths_of(plans: Iterable[SeriesPlan]) -> list[Path]:
    return [p for sp in plans for p in sp.paths]
