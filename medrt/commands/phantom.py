"""``medrt phantom ct|xray|sample``: write synthetic DICOM with lesion ground truth."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["register", "CODECS"]

# The names of medrt.phantom.COMPRESSIONS, spelled out so that building the
# parser does not import numpy, SimpleITK and pydicom (a test keeps them equal).
CODECS = ("htj2k", "j2k", "jpegls", "jpegxl", "none", "rle")


def _summary(out: Path, paths: list[Path], seconds: float, what: str = "lesions") -> str:
    from medrt.phantom import load_ground_truth

    truth = load_ground_truth(out)
    lesions = sum(len(t.scored_lesions) for t in truth.values())
    empty = sum(1 for t in truth.values() if not t.scored_lesions)
    size = sum(p.stat().st_size for p in paths) / 1e6
    return (
        f"wrote {len(paths)} files ({size:.1f} MB) to {out} in {seconds:.1f} s: "
        f"{lesions} {what}, {empty} frames without lesions; "
        f"ground truth in {out / 'ground_truth.json'}"
    )


def _run_ct(args: argparse.Namespace) -> int:
    import sys

    from medrt.phantom import write_ct_series, write_enhanced_ct

    if args.shuffle_frames and not args.enhanced:
        print("medrt phantom ct: --shuffle-frames needs --enhanced (single-frame slices have no frame order)",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.enhanced:
        paths = write_enhanced_ct(args.out, args.seed, n_frames=args.frames, size=args.size,
                                  compress=args.compress, shuffle_frames=args.shuffle_frames)
    else:
        paths = write_ct_series(
            args.out, args.seed, n_frames=args.frames, size=args.size, compress=args.compress
        )
    print(_summary(Path(args.out), paths, time.perf_counter() - t0, "lesion cross-sections"))
    return 0


def _run_xray(args: argparse.Namespace) -> int:
    from medrt.phantom import write_radiographs

    t0 = time.perf_counter()
    paths = write_radiographs(
        args.out,
        args.seed,
        count=args.count,
        size=args.size,
        compress=args.compress,
        monochrome1_every=1 if args.monochrome1 else None,
        spacing_mm=args.spacing,
    )
    print(_summary(Path(args.out), paths, time.perf_counter() - t0))
    return 0


def _run_sample(args: argparse.Namespace) -> int:
    from medrt.phantom import make_sample

    t0 = time.perf_counter()
    out = Path(args.out)
    paths = make_sample(out)
    seconds = time.perf_counter() - t0
    for sub in ("ct_stream", "radiographs"):
        mine = [p for p in paths if p.parent == out / sub]
        print(
            _summary(
                out / sub,
                mine,
                seconds,
                "lesions" if sub == "radiographs" else "lesion cross-sections",
            )
        )
    return 0


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low``, with a clear message otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


_positive = _at_least(1)
_seed = _at_least(0)
_size = _at_least(64)


def _spacing(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.01 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0.01..1 mm, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "phantom",
        help="write synthetic CT/DX DICOM with lesion ground truth (deterministic per seed)",
        description="Write synthetic DICOM frames with lesion ground truth "
        "(ground_truth.json + ground_truth_masks.npz next to the files). "
        "The same seed always gives the same files. No patient data.",
    )
    kinds = p.add_subparsers(dest="phantom_kind", metavar="KIND", required=True)
    codecs = list(CODECS)

    ct = kinds.add_parser("ct", help="an axial CT series streaming along z (512², HU)")
    ct.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    ct.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    ct.add_argument("--frames", type=_positive, default=40, help="number of slices (default 40)")
    ct.add_argument("--size", type=_size, default=512, help="rows = columns (default 512, >= 64)")
    ct.add_argument(
        "--compress",
        choices=codecs,
        default="rle",
        help="transfer syntax: lossless RLE, JPEG-LS, JPEG 2000, HTJ2K, JPEG XL, or none (default rle)",
    )
    ct.add_argument(
        "--enhanced",
        action="store_true",
        help="write the series as one multi-frame Legacy Converted Enhanced CT file "
        "(ct_enhanced.dcm; ground truth per frame, UID#n), not one file per slice",
    )
    ct.add_argument(
        "--shuffle-frames",
        action="store_true",
        help="with --enhanced, store the frames out of position order (drawn from the seed), "
        "as some scanners and conversions do",
    )
    ct.set_defaults(func=_run_ct)

    xr = kinds.add_parser("xray", help="chest radiographs (DX, 4096², nodules)")
    xr.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    xr.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    xr.add_argument("--count", type=_positive, default=3, help="number of radiographs (default 3)")
    xr.add_argument("--size", type=_size, default=4096, help="rows = columns (default 4096, >= 64)")
    xr.add_argument(
        "--compress", choices=codecs, default="jpegls", help="transfer syntax (default jpegls)"
    )
    xr.add_argument(
        "--spacing",
        type=_spacing,
        default=None,
        metavar="MM",
        help="ImagerPixelSpacing in mm (default: drawn per frame in 0.1-0.15)",
    )
    xr.add_argument(
        "--monochrome1",
        action="store_true",
        help="store every frame as MONOCHROME1 (inverted, CR style)",
    )
    xr.set_defaults(func=_run_xray)

    sm = kinds.add_parser("sample", help="regenerate the committed sample_dicom/ set exactly")
    sm.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="output folder (sample_dicom in the repository)",
    )
    sm.set_defaults(func=_run_sample)
