"""The ground-truth sidecar of a phantom folder: ``ground_truth.json`` + a masks ``.npz``.

The JSON lists every written frame with its file, SOPInstanceUID, frame index, pixel
spacing and lesions (the :class:`medrt.types.LesionTruth` fields). The ``.npz`` holds one
uint16 label map per frame, keyed by :func:`truth_key` (the SOPInstanceUID; ``UID#n`` for
frame n > 0 of a multi-frame object), in the frame's source pixel
grid and display semantics (what medrt's reader returns). The schema is described
in ``sample_dicom/README.md``. Both files are written byte-for-byte reproducibly.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from medrt.phantom.frame import PhantomFrame
from medrt.types import LesionTruth

__all__ = [
    "SCHEMA_VERSION",
    "TRUTH_JSON",
    "MASKS_NPZ",
    "TruthEntry",
    "FrameTruth",
    "TruthWriter",
    "load_ground_truth",
    "truth_key",
]

SCHEMA_VERSION = 1
TRUTH_JSON = "ground_truth.json"
MASKS_NPZ = "ground_truth_masks.npz"
_UNITS = {"ct": "HU", "xray": "presentation values 0..4095, display semantics"}


@dataclass(frozen=True, slots=True)
class TruthEntry:
    """What the writer knows about one written frame (``frame_index``: its frame in a
    multi-frame object, 0 for a single-frame image)."""

    frame: PhantomFrame
    file: str
    sop_instance_uid: str
    photometric: str
    spacing_source: str
    frame_index: int = 0


@dataclass(frozen=True)
class FrameTruth:
    """Ground truth of one frame, as loaded from a folder's sidecar.

    ``mask`` (the uint16 label map) is read from the ``.npz`` on first use.
    """

    file: Path
    sop_instance_uid: str
    frame_index: int
    spacing_mm: tuple[float, float]
    spacing_source: str
    rows: int
    cols: int
    photometric: str
    lesions: tuple[LesionTruth, ...]
    slice_location: float | None
    masks_path: Path = field(repr=False)
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    kind: str = ""  # the phantom kind of its sidecar: "ct" or "xray" ("" when unknown)
    # The series a slice belongs to (its sidecar; an in-memory phantom's kind and seed):
    # a lesion keeps its label on every slice of its series, so (volume, label) is one
    # lesion in 3-D. "" for a frame that is not a slice of a series (a radiograph).
    volume: str = ""

    @property
    def key(self) -> str:
        """The frame's key in :func:`load_ground_truth` and in the masks ``.npz``: the
        SOPInstanceUID, ``UID#n`` for frame n > 0 of a multi-frame object (frame 0 keeps
        the bare UID, which :func:`medrt.evaluation.evaluate` also finds as ``UID#0``)."""
        return truth_key(self.sop_instance_uid, self.frame_index)

    @property
    def mask(self) -> np.ndarray:
        if "mask" not in self._cache:
            with np.load(self.masks_path) as npz:
                key = self.key if self.key in npz.files else f"{self.sop_instance_uid}#{self.frame_index}"
                arr = np.asarray(npz[key])
            arr.flags.writeable = False
            self._cache["mask"] = arr
        return self._cache["mask"]

    @classmethod
    def from_phantom(cls, frame: PhantomFrame, key: str) -> FrameTruth:
        """The truth of an in-memory phantom frame (no sidecar on disk), keyed by ``key``."""
        return cls(
            file=Path(key), sop_instance_uid=key, frame_index=0, spacing_mm=frame.spacing_mm,
            spacing_source="PixelSpacing" if frame.kind == "ct" else "ImagerPixelSpacing",
            rows=frame.shape[0], cols=frame.shape[1], photometric="MONOCHROME2", lesions=frame.lesions,
            slice_location=frame.slice_location, masks_path=Path("/dev/null"), _cache={"mask": frame.labels},
            kind=frame.kind, volume="" if frame.slice_location is None else f"{frame.kind}{frame.seed}",
        )

    @property
    def scored_lesions(self) -> tuple[LesionTruth, ...]:
        """The lesions an evaluation should count (not flagged ``ignore``)."""
        return tuple(t for t in self.lesions if not t.extras.get("ignore"))


def truth_key(sop_instance_uid: str, frame_index: int) -> str:
    """A ground-truth frame's key: the UID, with ``#n`` for frame n > 0 of a multi-frame object."""
    return sop_instance_uid if frame_index == 0 else f"{sop_instance_uid}#{frame_index}"


def _lesion_json(t: LesionTruth) -> dict[str, Any]:
    d = asdict(t)
    d["center"] = list(t.center)
    d["bbox"] = list(t.bbox)
    return d


def _lesion_from_json(d: dict[str, Any]) -> LesionTruth:
    return LesionTruth(
        label=int(d["label"]),
        center=(float(d["center"][0]), float(d["center"][1])),
        bbox=tuple(int(v) for v in d["bbox"]),  # type: ignore[arg-type]
        diameter_mm=float(d["diameter_mm"]),
        area_mm2=float(d["area_mm2"]),
        contrast=float(d["contrast"]),
        shape=str(d["shape"]),
        kind=str(d["kind"]),
        extras={str(k): float(v) for k, v in d.get("extras", {}).items()},
    )


class TruthWriter:
    """Writes a folder's sidecar frame by frame: masks go to the ``.npz`` as they come.

    Use as a context manager; ``ground_truth.json`` is written on a clean exit. The
    zip entries carry a fixed timestamp, so the same frames give the same bytes
    (``np.savez_compressed`` would stamp the current time).
    """

    def __init__(self, folder: str | Path, seed: int, kind: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.seed, self.kind = seed, kind
        self._frames: list[dict[str, Any]] = []
        self._zip = zipfile.ZipFile(self.folder / MASKS_NPZ, "w", compression=zipfile.ZIP_DEFLATED)

    def __enter__(self) -> TruthWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._zip.close()
        if exc_type is None:
            self._write_json()

    def add(self, e: TruthEntry) -> None:
        f = e.frame
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(f.labels), allow_pickle=False)
        info = zipfile.ZipInfo(f"{truth_key(e.sop_instance_uid, e.frame_index)}.npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o644 << 16
        self._zip.writestr(info, buf.getvalue(), compresslevel=6)
        self._frames.append(
            {
                "file": e.file,
                "sop_instance_uid": e.sop_instance_uid,
                "frame_index": e.frame_index,
                "index": f.index,
                "spacing_mm": [f.spacing_mm[0], f.spacing_mm[1]],
                "spacing_source": e.spacing_source,
                "rows": f.shape[0],
                "cols": f.shape[1],
                "photometric": e.photometric,
                "slice_location": f.slice_location,
                "lesions": [_lesion_json(t) for t in f.lesions],
            }
        )

    def _write_json(self) -> Path:
        doc = {
            "version": SCHEMA_VERSION,
            "generator": "medrt.phantom",
            "seed": self.seed,
            "kind": self.kind,
            "units": _UNITS[self.kind],
            "masks": MASKS_NPZ,
            "frames": self._frames,
        }
        path = self.folder / TRUTH_JSON
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return path


def load_ground_truth(folder: str | Path) -> dict[str, FrameTruth]:
    """Read a phantom folder's sidecar: ``{key: FrameTruth}``, the key the SOPInstanceUID,
    ``UID#n`` for frame n > 0 of a multi-frame object (:attr:`FrameTruth.key`).

    Raises FileNotFoundError when the folder has no ``ground_truth.json`` and
    ValueError when its schema version is not one this code reads, or when it lists
    one frame twice.
    """
    folder = Path(folder)
    doc = json.loads((folder / TRUTH_JSON).read_text(encoding="utf-8"))
    if doc.get("version") != SCHEMA_VERSION or doc.get("generator") != "medrt.phantom":
        raise ValueError(
            f"{folder / TRUTH_JSON}: not a medrt.phantom ground truth of version {SCHEMA_VERSION}"
        )
    masks = folder / str(doc.get("masks", MASKS_NPZ))
    out: dict[str, FrameTruth] = {}
    for fr in doc["frames"]:
        uid, index = str(fr["sop_instance_uid"]), int(fr["frame_index"])
        key = truth_key(uid, index)
        if key in out:  # a multi-frame object's frames differ by frame_index; each was once kept as the last
            raise ValueError(f"{folder / TRUTH_JSON}: frame {index} of {uid} is listed twice")
        loc = fr.get("slice_location")
        out[key] = FrameTruth(
            file=folder / fr["file"],
            sop_instance_uid=uid,
            frame_index=index,
            spacing_mm=(float(fr["spacing_mm"][0]), float(fr["spacing_mm"][1])),
            spacing_source=str(fr["spacing_source"]),
            rows=int(fr["rows"]),
            cols=int(fr["cols"]),
            photometric=str(fr["photometric"]),
            lesions=tuple(_lesion_from_json(d) for d in fr["lesions"]),
            slice_location=None if loc is None else float(loc),
            masks_path=masks,
            kind=str(doc.get("kind", "")),
            volume="" if loc is None else str(folder / TRUTH_JSON),
        )
    return out
