"""``medrt eval PRED GT``: score a results.jsonl, or DICOM SEG objects, against phantom ground truth."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from medrt.errors import InputError
from medrt.evaluation import (
    RESULTS_JSONL,
    TARGET_GROUPS,
    BucketStats,
    EvalReport,
    FramePrediction,
    evaluate,
    iter_predictions,
    iter_seg_predictions,
    multi_frame_counts,
)
from medrt.phantom.truth import TRUTH_JSON, FrameTruth, load_ground_truth

__all__ = ["load_truth_tree", "format_report", "predictions", "register"]

Predictions = Callable[[], Iterable[FramePrediction]]


def load_truth_tree(paths: list[str]) -> dict[str, FrameTruth]:
    """Every ``ground_truth.json`` under ``paths`` (searched recursively), merged by key."""
    truth: dict[str, FrameTruth] = {}
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise InputError(root, "no such file or folder")
        if root.is_file():
            root = root.parent
        found = sorted(root.rglob(TRUTH_JSON))
        if not found:
            raise InputError(root, f"no {TRUTH_JSON} in it or below it")
        for path in found:
            try:
                part = load_ground_truth(path.parent)
            except (OSError, ValueError, KeyError) as exc:
                raise InputError(path, f"unreadable ground truth ({exc})") from exc
            twice = truth.keys() & part.keys()
            if twice:
                raise InputError(path, f"{len(twice)} frames already seen in another ground truth")
            truth.update(part)
    return truth


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100.0 * v:.1f}%"


def _num(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _interval(ci: tuple[float, float] | None) -> str:
    return "-" if ci is None else f"{100.0 * ci[0]:.0f}-{100.0 * ci[1]:.0f}%"


def _bucket_rows(buckets: tuple[BucketStats, ...], groups: tuple[BucketStats, ...]) -> list[str]:
    """One line per size bucket, per target group of several buckets (from 5 mm) and for all."""
    rows = [*buckets, *(g for g in groups if len(TARGET_GROUPS[g.name]) > 1),
            BucketStats("all", sum(b.gt for b in buckets), sum(b.detected for b in buckets))]
    return [f"{b.name:<10} {b.gt:>5} {b.detected:>9} {_pct(b.sensitivity):>12} {_interval(b.interval):>13}"
            for b in rows]


def format_report(r: EvalReport) -> str:
    """The report as a table for people: each rate with its 95 % Wilson interval, and the
    buckets pooled as the targets are set (from 5 mm)."""
    lines = [f"{'size (mm)':<10} {'GT':>5} {'detected':>9} {'sensitivity':>12} {'95% interval':>13}"]
    lines += _bucket_rows(r.buckets, r.groups)
    lesions, groups = r.by_lesion, r.lesion_groups
    if lesions is not None and groups is not None:  # slices of series: each lesion once as well
        lines += ["", "each lesion once (its sections in a series are one lesion, sized by the longest, found when "
                      "any section is):"]
        lines += _bucket_rows(lesions, groups)
    lines += [
        "",
        f"false positives: {r.false_positives} ({_num(r.fp_per_frame)} per frame; "
        f"{r.ignored_predictions} more on ignored lesions, not counted)",
        f"Dice of detected lesions ({len(r.dices)} with masks): "
        f"mean {_num(r.dice_mean)}, median {_num(r.dice_median)}",
        f"specificity: {_pct(r.specificity)} of {r.negative_frames} negative frames "
        f"have no false positive (95% interval {_interval(r.specificity_interval)})",
        f"frames: {r.frames}, {r.frames_without_prediction} without a prediction "
        f"(counted as predicted empty); {r.unknown_prediction_keys} predicted frames "
        f"not in the ground truth (skipped)",
    ]
    return "\n".join(lines)


KIND_NAMES = {"ct": "CT", "xray": "radiographs"}


def predictions(pred: str, *, seg: bool = False, segments: list[str] | None = None,
                truth: dict[str, FrameTruth] | None = None) -> Predictions:
    """How to read ``pred``, each time from the start: DICOM SEG objects (with ``seg``, a
    SEG file, or a folder without a results.jsonl), else a results.jsonl. ``truth`` says how
    many frames each multi-frame source has, so a SEG's frames left out read as empty."""
    path = Path(pred)
    if seg or segments or (path.is_dir() and not (path / RESULTS_JSONL).is_file()) or (
            path.is_file() and path.suffix.lower() != ".jsonl" and _is_dicom(path)):
        counts = multi_frame_counts(truth or {})
        return lambda: iter_seg_predictions(path, segments, counts)
    return lambda: iter_predictions(path)


def _is_dicom(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(132)[128:] == b"DICM"


def by_kind(read: Predictions, truth: dict[str, FrameTruth]) -> dict[str, EvalReport]:
    """One report per phantom kind when ``truth`` mixes them (CT slices and radiographs
    score very differently, so the pooled figures alone hide both); {} otherwise. A
    prediction goes to the kind of the object its key names (``SOPInstanceUID[#frame]``),
    whichever of its frames the ground truth holds: one of a frame it lacks is counted in
    that kind as not in the ground truth, as in the pooled report."""
    kind_of = {t.sop_instance_uid: t.kind for t in truth.values()}
    kinds = sorted(set(kind_of.values()))
    if len(kinds) < 2:
        return {}
    out = {}
    for kind in kinds:
        part = {key: t for key, t in truth.items() if t.kind == kind}
        preds = (p for p in read() if kind_of.get(p.key.partition("#")[0]) == kind)
        # the pooled report has matched the run as a whole: a kind whose predictions all name
        # frames its truth lacks is scored (every frame predicted empty), not refused
        out[KIND_NAMES.get(kind, kind or "unknown")] = evaluate(preds, part, require_match=False)
    return out


def run(args: argparse.Namespace) -> int:
    from medrt.cli import EXIT_OK

    truth = load_truth_tree(args.gt)
    read = predictions(args.pred, seg=args.seg, segments=args.segment, truth=truth)
    report = evaluate(read(), truth)
    parts = by_kind(read, truth)
    if args.json:
        doc = report.to_json(per_lesion=args.per_lesion)
        if parts:
            doc["by_kind"] = {k: r.to_json(per_lesion=False) for k, r in parts.items()}
        print(json.dumps(doc, indent=2))
    else:
        print(format_report(report))
        for name, part in parts.items():
            print(f"\n{name} ({part.frames} frames)")
            print("\n".join(format_report(part).splitlines()[:-1]))  # all but the frame counts
        if args.per_lesion:
            for m in report.matches:
                print(
                    f"{m.key} label {m.gt_label} {m.gt_diameter_mm:.1f} mm: "
                    + (
                        f"found (label {m.pred_label}, Dice {_num(m.dice)})"
                        if m.detected
                        else "missed"
                    )
                )
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "eval",
        help="score lesion predictions (results.jsonl or DICOM SEG) against phantom ground truth",
        description="Score lesion predictions against phantom ground truth: sensitivity per "
        "size bucket (2-5, 5-10, 10-30 mm), false positives per frame, Dice of detected "
        "lesions, specificity on frames without lesions. Ground-truth frames missing from "
        "the predictions count as predicted empty. The predictions are medrt's results.jsonl "
        "or DICOM SEG objects from any tool (each connected region of their segments one "
        "lesion). Exit status 2 when an input is missing or unreadable, or no prediction "
        "matches a ground-truth frame.",
    )
    p.add_argument(
        "pred",
        metavar="PRED",
        help=f"a {RESULTS_JSONL}, or a folder holding one (with an optional masks.npz beside it); "
             "or a DICOM SEG file, or a folder of them (searched recursively)",
    )
    p.add_argument(
        "gt",
        nargs="+",
        metavar="GT",
        help=f"ground-truth folders, searched recursively for {TRUTH_JSON}",
    )
    p.add_argument("--seg", action="store_true",
                   help=f"score the DICOM SEG objects under PRED even where a {RESULTS_JSONL} is (a medrt "
                        "output folder: its seg.dcm files)")
    p.add_argument("--segment", action="append", metavar="N|LABEL",
                   help="score only this segment of each SEG, by number or label (repeatable; default: every "
                        "segment, so a SEG that also holds an organ needs it)")
    p.add_argument("--json", action="store_true", help="print one JSON object for programs")
    p.add_argument("--per-lesion", action="store_true", help="also list every scored lesion")
    p.set_defaults(func=run)
