"""Score any pipeline's lesions against phantom ground truth.

Input is one :class:`FramePrediction` per frame (lesions, and optionally the
frame's uint16 label map) and the ground truth of
:func:`medrt.phantom.load_ground_truth`; output is an :class:`EvalReport`.
:func:`load_predictions` reads the batch mode's public output (``results.jsonl``
plus an optional ``masks.npz``); :func:`iter_seg_predictions` reads DICOM SEG objects,
medrt's or any other tool's, each connected region of the chosen segments one lesion.

Matching rule, per frame:

1. Ground-truth lesions flagged ``ignore`` (cross-sections under 2 mm) are set
   aside before scoring.
2. A predicted lesion and a scored ground-truth lesion are *candidates* when
   (a) both masks are available and their Dice overlap is >= 0.1, or (b) their
   centroids are at most ``max(2 mm, 0.5 x GT diameter_mm)`` apart (the fallback
   for tiny lesions and for predictions without a mask). Distances use the
   frame's ground-truth pixel spacing.
3. Candidates are paired one-to-one, greedily: highest Dice first (0 when no mask),
   then shortest centroid distance. A paired ground-truth lesion is detected.
4. A leftover prediction that is a candidate of an ignored lesion, or whose mask
   overlaps a scored lesion's mask (a fragment of a lesion split in two), is
   neither a true nor a false positive. Every other leftover prediction is a
   false positive.

Size buckets go by the ground-truth ``diameter_mm``: [0, 5) "2-5", [5, 10) "5-10",
[10, inf) "10-30" (lesions under 2 mm count in the first bucket, over 30 mm in
the last). Dice of a detected lesion is between its ground-truth mask and the one
predicted component paired with it. Frames without a prediction count as
predicted empty; a negative frame (no scored lesion) is a true negative when it
has no false positive.

Rates come with a 95 % Wilson score interval (:func:`proportion_interval`), which
says how far a rate measured on a few dozen lesions may be from the rate on many:
40 of 43 is 0.93, but anything from 0.81 to 0.98 fits it. The interval takes the
lesions as independent trials; the cross-sections of one CT lesion on neighbouring
slices are not, so on CT series it is narrower than it should be. For that,
:meth:`EvalReport.by_lesion` also counts each lesion once: the sections of one lesion
in one series (the same label on slices of the same ground-truth series) are one
lesion, sized by its longest section and found when any of its sections is found.
"""

from __future__ import annotations

import json
import logging
import math
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from medrt.errors import InputError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from medrt.phantom.truth import FrameTruth
    from medrt.types import LesionTruth

__all__ = [
    "BUCKETS",
    "TARGET_GROUPS",
    "DICE_MIN",
    "MIN_DISTANCE_MM",
    "RESULTS_JSONL",
    "MASKS_NPZ",
    "PredictedLesion",
    "FramePrediction",
    "LesionMatch",
    "BucketStats",
    "EvalReport",
    "bucket_of",
    "proportion_interval",
    "evaluate",
    "iter_predictions",
    "iter_seg_predictions",
    "load_predictions",
    "multi_frame_counts",
]

log = logging.getLogger(__name__)

# (name, lower edge in mm); a lesion goes in the last bucket whose edge it reaches.
BUCKETS: tuple[tuple[str, float], ...] = (("2-5", 0.0), ("5-10", 5.0), ("10-30", 10.0))
# The groups of buckets the sensitivity targets are set on (issue 3: >= 0.95 from 5 mm,
# >= 0.85 for 2-5 mm): name -> buckets pooled.
TARGET_GROUPS: dict[str, tuple[str, ...]] = {"2-5": ("2-5",), ">=5": ("5-10", "10-30")}
CONFIDENCE = 0.95
DICE_MIN = 0.1
MIN_DISTANCE_MM = 2.0
DISTANCE_FRACTION = 0.5
RESULTS_JSONL = "results.jsonl"
MASKS_NPZ = "masks.npz"


class PredictedLesion(Protocol):
    """What evaluation needs of a predicted lesion (:class:`medrt.types.Lesion` has it)."""

    @property
    def label(self) -> int: ...
    @property
    def bbox(self) -> tuple[int, int, int, int]: ...
    @property
    def centroid(self) -> tuple[float, float]: ...
    @property
    def diameter_mm(self) -> float: ...


@dataclass(frozen=True, slots=True, eq=False)
class FramePrediction:
    """A pipeline's output for one frame.

    ``key`` is the SOPInstanceUID, or ``"UID#frame"`` for a frame of a
    multi-frame object (:attr:`medrt.types.Frame.key`). ``labels``, when given, is
    the frame's uint16 label map, where each lesion's pixels hold its ``label``
    (inside the lesion's ``bbox``, where Dice looks for them).
    """

    key: str
    lesions: tuple[PredictedLesion, ...] = ()
    labels: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class LesionMatch:
    """One scored ground-truth lesion and the prediction paired with it, if any."""

    key: str
    gt_label: int
    gt_diameter_mm: float
    bucket: str
    pred_label: int | None = None
    dice: float | None = None
    distance_mm: float | None = None
    volume: str = ""  # the ground-truth series of a slice (FrameTruth.volume); "" for a radiograph

    @property
    def detected(self) -> bool:
        return self.pred_label is not None

    @property
    def lesion(self) -> tuple[str, int]:
        """Which lesion this is in 3-D: (series, label) for a slice, (frame, label) otherwise."""
        return (self.volume, self.gt_label) if self.volume else (self.key, self.gt_label)


def proportion_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The Wilson score interval of ``k`` successes in ``n`` trials (None for ``n`` = 0):
    where the rate of many more trials may lie, given these. Wilson rather than the
    normal approximation, which leaves [0, 1] and collapses to a point at 0 or ``n``
    successes (scipy's ``binomtest(...).proportion_ci``)."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True, slots=True)
class BucketStats:
    name: str
    gt: int
    detected: int

    @property
    def sensitivity(self) -> float | None:
        return self.detected / self.gt if self.gt else None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The sensitivity's 95 % Wilson interval (:func:`proportion_interval`)."""
        return proportion_interval(self.detected, self.gt)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "gt": self.gt, "detected": self.detected, "sensitivity": self.sensitivity,
                "interval": self.interval}


def _pool(buckets: Iterable[BucketStats], name: str, members: tuple[str, ...]) -> BucketStats:
    chosen = [b for b in buckets if b.name in members]
    return BucketStats(name, sum(b.gt for b in chosen), sum(b.detected for b in chosen))


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Detection and segmentation scores over a set of frames."""

    buckets: tuple[BucketStats, ...]
    false_positives: int
    ignored_predictions: int
    frames: int
    negative_frames: int
    negative_frames_clean: int
    frames_without_prediction: int
    unknown_prediction_keys: int
    matches: tuple[LesionMatch, ...]

    @property
    def gt_lesions(self) -> int:
        return sum(b.gt for b in self.buckets)

    @property
    def detected(self) -> int:
        return sum(b.detected for b in self.buckets)

    @property
    def sensitivity(self) -> float | None:
        return self.detected / self.gt_lesions if self.gt_lesions else None

    def pooled(self, name: str, buckets: tuple[str, ...]) -> BucketStats:
        """``buckets`` counted as one (``name``): a target's size range, as in
        :data:`TARGET_GROUPS`."""
        return _pool(self.buckets, name, buckets)

    @property
    def groups(self) -> tuple[BucketStats, ...]:
        """The buckets pooled as the sensitivity targets are set (:data:`TARGET_GROUPS`)."""
        return tuple(self.pooled(name, buckets) for name, buckets in TARGET_GROUPS.items())

    @property
    def by_lesion(self) -> tuple[BucketStats, ...] | None:
        """Sensitivity per size bucket with each lesion counted once (:attr:`LesionMatch.lesion`):
        sized by its longest scored section, found when any section is. None when no scored
        section belongs to a series (radiographs only: there a section is a lesion, and
        :attr:`buckets` says it all)."""
        if not any(m.volume for m in self.matches):
            return None
        size: dict[tuple[str, int], float] = {}
        found: dict[tuple[str, int], bool] = {}
        for m in self.matches:
            size[m.lesion] = max(size.get(m.lesion, 0.0), m.gt_diameter_mm)
            found[m.lesion] = found.get(m.lesion, False) or m.detected
        counts = {name: [0, 0] for name, _ in BUCKETS}
        for key, diameter in size.items():
            counts[bucket_of(diameter)][0] += 1
            counts[bucket_of(diameter)][1] += int(found[key])
        return tuple(BucketStats(name, gt, det) for name, (gt, det) in counts.items())

    @property
    def lesion_groups(self) -> tuple[BucketStats, ...] | None:
        """:attr:`by_lesion` pooled as the sensitivity targets are set (:data:`TARGET_GROUPS`)."""
        lesions = self.by_lesion
        return None if lesions is None else tuple(_pool(lesions, n, b) for n, b in TARGET_GROUPS.items())

    @property
    def specificity_interval(self) -> tuple[float, float] | None:
        """The specificity's 95 % Wilson interval."""
        return proportion_interval(self.negative_frames_clean, self.negative_frames)

    @property
    def fp_per_frame(self) -> float | None:
        return self.false_positives / self.frames if self.frames else None

    @property
    def specificity(self) -> float | None:
        """Fraction of negative frames without a false positive."""
        return self.negative_frames_clean / self.negative_frames if self.negative_frames else None

    @property
    def dices(self) -> tuple[float, ...]:
        return tuple(m.dice for m in self.matches if m.detected and m.dice is not None)

    @property
    def dice_mean(self) -> float | None:
        d = self.dices
        return float(np.mean(d)) if d else None

    @property
    def dice_median(self) -> float | None:
        d = self.dices
        return float(np.median(d)) if d else None

    def to_json(self, per_lesion: bool = False) -> dict[str, Any]:
        """A JSON-ready summary; ``per_lesion`` adds every scored lesion's match."""
        out: dict[str, Any] = {
            "frames": self.frames,
            "frames_without_prediction": self.frames_without_prediction,
            "unknown_prediction_keys": self.unknown_prediction_keys,
            "buckets": [b.to_json() for b in self.buckets],
            "groups": [g.to_json() for g in self.groups],
            "gt_lesions": self.gt_lesions,
            "detected": self.detected,
            "sensitivity": self.sensitivity,
            "sensitivity_interval": proportion_interval(self.detected, self.gt_lesions),
            "false_positives": self.false_positives,
            "fp_per_frame": self.fp_per_frame,
            "ignored_predictions": self.ignored_predictions,
            "dice": {"n": len(self.dices), "mean": self.dice_mean, "median": self.dice_median},
            "negative_frames": self.negative_frames,
            "negative_frames_clean": self.negative_frames_clean,
            "specificity": self.specificity,
            "specificity_interval": self.specificity_interval,
        }
        lesions, groups = self.by_lesion, self.lesion_groups
        if lesions is not None and groups is not None:
            out["by_lesion"] = {"buckets": [b.to_json() for b in lesions], "groups": [g.to_json() for g in groups],
                                "gt_lesions": sum(b.gt for b in lesions),
                                "detected": sum(b.detected for b in lesions)}  # fmt: skip
        if per_lesion:
            out["lesions"] = [asdict(m) for m in self.matches]
        return out


def bucket_of(diameter_mm: float) -> str:
    """The size bucket of a ground-truth diameter."""
    name = BUCKETS[0][0]
    for n, lo in BUCKETS:
        if diameter_mm >= lo:
            name = n
    return name


def evaluate(predictions: Iterable[FramePrediction], truth: Mapping[str, FrameTruth], *,
             require_match: bool = True) -> EvalReport:
    """Score ``predictions`` against ``truth`` ({key: FrameTruth}) with the module's rule.

    Every frame of ``truth`` is scored; frames with no prediction count as
    predicted empty. Predictions for keys not in ``truth`` are skipped and
    counted. Predictions are scored as they arrive, so a generator such as
    :func:`iter_predictions` holds one frame's label map at a time. Raises
    InputError for a duplicate key, a label map of the wrong shape, or when no
    prediction matches any ground-truth frame (unless ``require_match`` is False: a
    part of a run whose whole was matched, as ``medrt eval`` scores each kind).
    """
    seen: set[str] = set()
    unknown = fp = ignored = negatives = clean = 0
    matches: list[LesionMatch] = []

    def score(key: str, pred: FramePrediction) -> None:
        nonlocal fp, ignored, negatives, clean
        frame_matches, frame_fp, frame_ignored = _score_frame(key, pred, truth[key])
        matches.extend(frame_matches)
        fp += frame_fp
        ignored += frame_ignored
        if not frame_matches:
            negatives += 1
            clean += int(frame_fp == 0)

    for p in predictions:  # one frame at a time: label maps are not all held at once
        key = _truth_key(p.key, truth)
        if key is None:
            unknown += 1
            continue
        if key in seen:
            raise InputError(p.key, "two predictions for the same frame")
        seen.add(key)
        score(key, p)
    if unknown and not seen and require_match:
        raise InputError(
            "predictions",
            f"none of {unknown} prediction keys matches one of the {len(truth)} ground-truth "
            f"frames (keys are SOPInstanceUIDs, e.g. {next(iter(truth), '?')!r})",
        )
    if unknown:
        log.warning("%d predicted frames are not in the ground truth; skipped", unknown)
    for key in truth:
        if key not in seen:
            score(key, FramePrediction(key))

    counts = {name: [0, 0] for name, _ in BUCKETS}
    for m in matches:
        counts[m.bucket][0] += 1
        counts[m.bucket][1] += int(m.detected)
    return EvalReport(
        buckets=tuple(BucketStats(n, gt, det) for n, (gt, det) in counts.items()),
        false_positives=fp,
        ignored_predictions=ignored,
        frames=len(truth),
        negative_frames=negatives,
        negative_frames_clean=clean,
        frames_without_prediction=len(truth) - len(seen),
        unknown_prediction_keys=unknown,
        matches=tuple(matches),
    )


def _truth_key(key: str, truth: Mapping[str, FrameTruth]) -> str | None:
    """The ground-truth key of a prediction key: exact, or ``UID#n`` for frame n of ``UID``."""
    if key in truth:
        return key
    uid, sep, frame = key.partition("#")
    t = truth.get(uid) if sep else None
    if t is not None and frame.isdigit() and int(frame) == t.frame_index:
        return uid
    return None


def _score_frame(
    key: str, pred: FramePrediction, t: FrameTruth
) -> tuple[list[LesionMatch], int, int]:
    """Pair one frame's predictions with its truth: (matches of scored lesions, FPs, ignored)."""
    if pred.labels is not None and pred.labels.shape != (t.rows, t.cols):
        raise InputError(
            key, f"label map shape {pred.labels.shape} differs from the frame's {(t.rows, t.cols)}"
        )
    scored = t.scored_lesions
    ignored_gt = tuple(g for g in t.lesions if g.extras.get("ignore"))
    preds = pred.lesions
    if not preds and not scored:
        return [], 0, 0
    pmasks = [_Region.of(pred.labels, p.label, p.bbox) for p in preds]
    with_masks = pred.labels is not None and bool(scored or ignored_gt)
    gmasks = {g.label: _Region.of(t.mask, g.label, g.bbox) for g in t.lesions} if with_masks else {}

    def pair(i: int, g: LesionTruth) -> tuple[float | None, float] | None:
        p = preds[i]
        dist = math.hypot(
            (p.centroid[0] - g.center[0]) * t.spacing_mm[0],
            (p.centroid[1] - g.center[1]) * t.spacing_mm[1],
        )
        pm, gm = pmasks[i], gmasks.get(g.label)
        dice = pm.dice(gm) if pm is not None and gm is not None else None
        near = dist <= max(MIN_DISTANCE_MM, DISTANCE_FRACTION * g.diameter_mm)
        if near or (dice is not None and dice >= DICE_MIN):
            return dice, dist
        return None

    cands: list[tuple[float, float, int, int, float | None]] = []
    for j, g in enumerate(scored):
        for i in range(len(preds)):
            c = pair(i, g)
            if c is not None:
                cands.append((-(c[0] or 0.0), c[1], i, j, c[0]))
    cands.sort()
    used_p: set[int] = set()
    found: dict[int, tuple[int, float | None, float]] = {}
    for _, dist, i, j, dice in cands:
        if i in used_p or j in found:
            continue
        used_p.add(i)
        found[j] = (i, dice, dist)

    matches = []
    for j, g in enumerate(scored):
        bucket = bucket_of(g.diameter_mm)
        if j in found:
            i, dice, dist = found[j]
            label = int(preds[i].label)
            matches.append(LesionMatch(key, g.label, g.diameter_mm, bucket, label, dice, dist, t.volume))
        else:
            matches.append(LesionMatch(key, g.label, g.diameter_mm, bucket, volume=t.volume))
    leftover = [i for i in range(len(preds)) if i not in used_p]

    def neutral(i: int) -> bool:
        if any(pair(i, g) is not None for g in ignored_gt):
            return True
        pm = pmasks[i]
        return pm is not None and any(pm.dice(gmasks.get(g.label)) > 0 for g in scored if gmasks.get(g.label))

    on_ignored = sum(1 for i in leftover if neutral(i))
    return matches, len(leftover) - on_ignored, on_ignored


@dataclass(frozen=True, slots=True, eq=False)
class _Region:
    """One label's pixels inside its box: ``mask`` at offset ``(r0, c0)``."""

    r0: int
    c0: int
    mask: np.ndarray
    size: int

    @classmethod
    def of(
        cls, labels: np.ndarray | None, label: int, bbox: tuple[int, int, int, int]
    ) -> _Region | None:
        """The label's pixels inside ``bbox``; None without a label map or with no pixels."""
        if labels is None:
            return None
        r0, c0 = max(int(bbox[0]), 0), max(int(bbox[1]), 0)
        mask = labels[r0 : int(bbox[2]), c0 : int(bbox[3])] == label
        size = int(np.count_nonzero(mask))
        return cls(r0, c0, mask, size) if size else None

    def dice(self, other: _Region) -> float:
        r0, c0 = max(self.r0, other.r0), max(self.c0, other.c0)
        r1 = min(self.r0 + self.mask.shape[0], other.r0 + other.mask.shape[0])
        c1 = min(self.c0 + self.mask.shape[1], other.c0 + other.mask.shape[1])
        inter = 0
        if r0 < r1 and c0 < c1:
            a = self.mask[r0 - self.r0 : r1 - self.r0, c0 - self.c0 : c1 - self.c0]
            b = other.mask[r0 - other.r0 : r1 - other.r0, c0 - other.c0 : c1 - other.c0]
            inter = int(np.count_nonzero(a & b))
        return 2.0 * inter / (self.size + other.size)


def iter_predictions(path: str | Path) -> Iterator[FramePrediction]:
    """Read a ``results.jsonl`` (or a folder holding one) frame by frame.

    Each line is a JSON object with ``sop_instance_uid``, ``frame_index`` and
    ``lesions`` (records of :func:`medrt.analysis.lesions.lesion_to_json`); an
    optional ``key`` overrides the frame key. A sibling ``masks.npz`` maps frame
    keys to uint16 label maps whose values are the lesion ``id``s; maps are read
    one frame at a time. Raises InputError for a missing or malformed file.
    """
    from medrt.analysis.lesions import lesion_from_json

    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_JSONL
    if not path.is_file():
        raise InputError(path, f"no {RESULTS_JSONL} found")
    masks_path = path.with_name(MASKS_NPZ)
    try:
        npz = np.load(masks_path, allow_pickle=False) if masks_path.is_file() else None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(masks_path, f"the label maps cannot be read ({type(exc).__name__}: {exc})") from None
    try:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    uid, idx = str(rec["sop_instance_uid"]), int(rec["frame_index"])
                    lesions = tuple(lesion_from_json(d) for d in rec["lesions"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise InputError(path, f"line {n}: not a results record ({exc!r})") from exc
                key = str(rec.get("key") or (uid if idx == 0 else f"{uid}#{idx}"))
                labels = None
                if npz is not None:
                    for k in (key, f"{uid}#{idx}", uid if idx == 0 else None):
                        if k is not None and k in npz.files:
                            labels = np.asarray(npz[k])
                            break
                yield FramePrediction(key, lesions, labels)
    except UnicodeDecodeError as exc:  # a masks.npz, a PNG, a DICOM file given as PRED
        raise InputError(path, f"not a {RESULTS_JSONL} (not UTF-8 text at byte {exc.start}); "
                               "give a results.jsonl, its folder, or DICOM SEG (--seg)") from None
    finally:
        if npz is not None:
            npz.close()


def load_predictions(path: str | Path) -> list[FramePrediction]:
    """All frames of :func:`iter_predictions` as a list (label maps held in memory)."""
    return list(iter_predictions(path))


def iter_seg_predictions(path: str | Path, segments: Sequence[int | str] | None = None,
                         source_frames: Mapping[str, int] | None = None) -> Iterator[FramePrediction]:
    """Read DICOM SEG objects (a file, or every SEG in a folder, searched recursively) frame
    by frame: each connected region of the ``segments`` (numbers or labels; all by
    default) on a source frame is one predicted lesion, with its mask. Every image a SEG
    names as a source is a prediction, so frames it left out are predicted empty; so is
    every frame of a multi-frame source whose number of frames ``source_frames`` gives
    (:func:`multi_frame_counts` of the ground truth), which the SEG itself does not say.
    Raises InputError naming the file when it is not a readable SEG or lacks a segment
    asked for, or when a folder holds no SEG."""
    from medrt.analysis.lesions import lesions_from_probability
    from medrt.io.seg import read_seg

    path = Path(path)
    files = [path] if path.is_file() else _seg_files(path)
    for file in files:
        try:
            seg = read_seg(file, segments, source_frames)
        except ValueError as exc:
            raise InputError(file, str(exc).removeprefix(f"{file.name}: ")) from exc
        for key, labels in seg.masks.items():
            # each region is a lesion, whichever segment it is in; the sizes are in pixels
            # (scoring measures with the ground truth's spacing)
            found, lesions = lesions_from_probability((labels > 0).astype(np.float32), None, 0.5)
            yield FramePrediction(key, tuple(lesions), found)


def multi_frame_counts(truth: Mapping[str, FrameTruth]) -> dict[str, int]:
    """The number of frames of each multi-frame object of ``truth`` ({SOPInstanceUID: n}, n
    one more than its last frame_index), for :func:`iter_seg_predictions`."""
    counts: dict[str, int] = {}
    for t in truth.values():
        if t.frame_index > 0:
            counts[t.sop_instance_uid] = max(counts.get(t.sop_instance_uid, 0), t.frame_index + 1)
    return counts


def _seg_files(root: Path) -> list[Path]:
    """The DICOM SEG objects under ``root`` (their SOP Class read from the header)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    from medrt.io.seg import SEG_SOP_CLASSES

    if not root.is_dir():
        raise InputError(root, "no such file or folder")
    found = []
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        try:
            ds = pydicom.dcmread(p, stop_before_pixels=True, specific_tags=["SOPClassUID"])
        except (InvalidDicomError, OSError, ValueError, TypeError, AttributeError):
            continue  # not DICOM: a folder of results holds CSVs and PNGs too
        if str(ds.get("SOPClassUID", "")) in SEG_SOP_CLASSES:
            found.append(p)
    if not found:
        also = "" if (root / RESULTS_JSONL).is_file() else f"no {RESULTS_JSONL} in it, and "
        raise InputError(root, f"{also}no DICOM SEG in it or below it")
    return found
