"""``medrt info PATH...``: what medrt sees in each file, and whether it decodes."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydicom.uid import UID

from medrt.commands.options import DEFAULT_SEG_MODEL, add_routing_options
from medrt.errors import CorruptDicomError, InputError
from medrt.io.dicom import frames_from_dataset, read_dataset
from medrt.io.header import spacing_problem
from medrt.io.media import is_dicomdir, read_dicomdir
from medrt.io.scan import iter_files
from medrt.types import Frame

__all__ = ["FileInfo", "inspect_file", "register"]


@dataclass
class FileInfo:
    """One file as medrt sees it. No patient attributes: this goes to screens and logs."""

    path: str
    ok: bool
    skipped: bool = False
    error: str | None = None
    error_kind: str | None = None
    sop_class: str | None = None
    sop_instance_uid: str | None = None
    series_instance_uid: str | None = None
    modality: str | None = None
    transfer_syntax: str | None = None
    transfer_syntax_uid: str | None = None
    rows: int | None = None
    cols: int | None = None
    frames: int | None = None
    spacing_mm: list[float] | None = None
    spacing_source: str | None = None
    spacing_problem: str | None = None  # why a spacing the header gives is not used
    photometric: str | None = None
    bits_stored: int | None = None
    window: dict[str, Any] | None = None
    decode_ms: float | None = None
    # --route: the segmentation model that takes the image (``name@version``), or why none does
    route: str | None = None
    passed_over: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Router = Callable[[Frame], "tuple[str | None, str | None]"]


def router(model: str, aliases: dict[str, str], strict: bool) -> Router:
    """What ``medrt info --route`` asks of each image's first frame: the segmentation model
    (of ``model``, comma-separated names or specs) the analyzer would route it to, or the
    reason it would pass the image over, with the same routing rules (aliases, strict) and
    without loading a model into a runtime (specs only)."""
    from types import SimpleNamespace

    from medrt.analysis.config import AnalyzerConfig
    from medrt.engine.registry import find_spec
    from medrt.engine.routing import ImageKind, aliased, route

    config = AnalyzerConfig(seg_model=model, body_part_aliases=aliases, strict_routing=strict)  # checks them
    segs = [SimpleNamespace(spec=find_spec(name.strip(), verify=False)) for name in model.split(",") if name.strip()]

    def routed(frame: Frame) -> tuple[str | None, str | None]:
        kind = aliased(ImageKind.of_frame(frame), config.body_part_aliases)
        chosen, reason = route(segs, kind, config.strict_routing)
        return (chosen.spec.ident if chosen is not None else None), reason

    return routed


def inspect_file(path: Path, routed: Router | None = None) -> FileInfo:
    """Read and decode ``path``; report what was found, or the error that stopped it (and,
    with ``routed``, which model takes it)."""
    info = FileInfo(path=str(path), ok=False)
    try:
        ds = read_dataset(path, defer_size=1 << 16)  # pixels stay in the file until decoded
        try:
            info.sop_class = UID(str(ds.SOPClassUID)).name if "SOPClassUID" in ds else None
            info.sop_instance_uid = str(ds.get("SOPInstanceUID", "") or "") or None
            meta = getattr(ds, "file_meta", None)
            ts = meta.get("TransferSyntaxUID") if meta is not None else None
        except Exception as exc:  # a damaged element (an unknown VR, a length past the end): one file's error
            raise CorruptDicomError(path, f"a header attribute cannot be read ({type(exc).__name__})") from exc
        if ts:
            info.transfer_syntax, info.transfer_syntax_uid = UID(str(ts)).name, str(ts)
        t0 = time.perf_counter()
        frames = frames_from_dataset(ds, path=path, name=path)
        info.decode_ms = round((time.perf_counter() - t0) * 1000.0, 2)
    except InputError as exc:
        info.error, info.error_kind = exc.reason, type(exc).__name__
        return info
    first = frames[0]
    info.ok = True
    info.transfer_syntax_uid = first.source.transfer_syntax_uid
    info.transfer_syntax = UID(first.source.transfer_syntax_uid).name
    info.series_instance_uid = first.series_instance_uid or None
    info.modality = first.modality or None
    info.rows, info.cols, info.frames = first.rows, first.cols, len(frames)
    info.spacing_mm = list(first.spacing_mm) if first.spacing_mm else None
    info.spacing_source = first.spacing_source.value
    if not first.spacing_mm:
        info.spacing_problem = spacing_problem(ds, first.frame_index)
    info.photometric = first.photometric
    info.bits_stored = int(first.source.dataset.get("BitsStored", 0) or 0) or None
    info.window = {"center": round(first.window.center, 3), "width": round(first.window.width, 3), "source": first.window.source.value}
    if routed is not None:
        info.route, info.passed_over = routed(first)
    return info


def several_acquisitions(paths: list[Path]) -> list[dict[str, Any]]:
    """The series among ``paths`` that hold several whole acquisitions at the same slice
    positions (:attr:`medrt.io.series.Series.stacks`: a pre- and a post-contrast pass in one
    series), which medrt analyses as a stack each rather than keeping one image per position."""
    from medrt.io.series import group_series

    return [{"series_instance_uid": s.series_instance_uid, "acquisition_numbers": list(s.acquisition_numbers),
             "images": [len(stack) for stack in s.stacks]}
            for s in group_series(paths, dicomdir=False).series if s.stacks]


def _human(info: FileInfo) -> str:
    if info.skipped:
        return f"{info.path}\n  skipped: {info.error}"
    if not info.ok:
        return f"{info.path}\n  ERROR ({info.error_kind}): {info.error}"
    spacing = (
        f"{info.spacing_mm[0]:g}x{info.spacing_mm[1]:g} mm ({info.spacing_source})" if info.spacing_mm
        else f"no usable spacing ({info.spacing_problem})" if info.spacing_problem else "no spacing"
    )
    window = info.window or {}
    parts = [
        info.sop_class or "unknown SOP class",
        info.modality or "?",
        info.transfer_syntax or "?",
        f"{info.rows}x{info.cols}",
        f"{info.frames} frame{'s' if info.frames != 1 else ''}",
        spacing,
        f"{info.photometric}, {info.bits_stored} bits",
        f"window {window.get('center'):g}/{window.get('width'):g} ({window.get('source')})",
        f"decoded in {info.decode_ms:.1f} ms",
    ]
    text = f"{info.path}\n  " + " | ".join(parts)
    if info.route:
        text += f"\n  -> {info.route}"
    elif info.passed_over:
        text += f"\n  -> passed over: {info.passed_over}"
    return text


def run(args: argparse.Namespace) -> int:
    from medrt.cli import EXIT_OK, EXIT_PARTIAL

    results: list[FileInfo] = []
    media: list[dict[str, Any]] = []  # each DICOMDIR named: what it lists (counts, no names)
    routed = router(args.model, dict(args.body_part_alias), args.strict_routing) if args.route else None
    for given in args.paths:
        walked = Path(given).is_dir()
        paths: Iterable[Path] = iter_files([given], follow_outside_links=args.follow_links)
        if not walked and is_dicomdir(given):  # read once: its summary, then its files
            try:
                listing = read_dicomdir(given)
            except ValueError as exc:
                media.append({"dicomdir": str(given), "error": str(exc)})
                paths = [Path(given)]
            else:
                media.append({"dicomdir": str(given), "summary": listing.summary(), "files": len(listing.files),
                              "missing": [str(p) for p in listing.missing], "refused": listing.refused,
                              "records": dict(listing.records)})
                paths = listing.files
        for path in paths:
            info = inspect_file(path, routed)
            # Inside a folder, files that are not DICOM at all (notes, sidecars) and DICOM
            # objects that are not images (a disc's DICOMDIR, SR, SEG) are passed over with
            # a note, as medrt batch passes them over; a file named on the command line is not.
            info.skipped = walked and info.error_kind in ("NotDicomError", "NotAnImageError")
            results.append(info)
    stacked = several_acquisitions([Path(r.path) for r in results if r.ok])
    decoded = sum(r.ok for r in results)
    skipped = sum(r.skipped for r in results)
    errors = len(results) - decoded - skipped
    if args.json:
        summary = {"files": len(results), "decoded": decoded, "errors": errors, "skipped": skipped}
        print(json.dumps({"files": [asdict(r) for r in results], "summary": summary,
                          "several_acquisitions": stacked, **({"media": media} if media else {})}, indent=2))
    else:
        for m in media:
            print(m.get("summary") or m["error"])
        for r in results:
            print(_human(r))
        for s in stacked:
            print(f"\nseries {s['series_instance_uid']}: {len(s['acquisition_numbers'])} acquisitions at the same "
                  f"slice positions (AcquisitionNumber {', '.join(str(n) for n in s['acquisition_numbers'])}; "
                  f"{' + '.join(str(n) for n in s['images'])} images): each is analysed as a stack of its own")
        print(
            f"\n{len(results)} file(s): {decoded} decoded, {errors} with errors, {skipped} skipped "
            "(not DICOM, or not an image)"
        )
    return EXIT_PARTIAL if errors or not decoded else EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "info",
        help="show what medrt sees in DICOM files (SOP class, syntax, size, spacing) and whether they decode",
        description="Show what medrt sees in each file: SOP class, transfer syntax, size, frames, "
        "spacing and window, and whether the pixels decode (with the reason when they do not). "
        "Folders are searched recursively; files in them that are not DICOM at all, and DICOM "
        "objects that are not images (DICOMDIR, SR, SEG), are skipped with a note. Exit status 1 when any DICOM file (or any file named on the "
        "command line) has an error, or nothing decoded.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, folders or DICOMDIRs")
    p.add_argument("--json", action="store_true", help="print one JSON object for programs")
    p.add_argument("--follow-links", action="store_true", help="follow symbolic links that lead outside a folder")
    g = p.add_argument_group("routing (--route)")
    g.add_argument("--route", action="store_true",
                   help="also say which segmentation model the analysis would give each image, or why it would "
                        "pass it over (modality, SOP class, Image Type, body part, view, plane), without running it")
    g.add_argument("--model", default=DEFAULT_SEG_MODEL,
                   help=f"with --route: the segmentation models, as the analysis options take them (default "
                        f"{DEFAULT_SEG_MODEL})")
    add_routing_options(g, when="with --route: ")
    p.set_defaults(func=run)
