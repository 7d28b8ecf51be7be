"""What any detector could find in the CT phantoms: a sensitivity ceiling per size bucket.

    python -m medrt.models.ceiling                       # the 8 validation series (seeds 5100-5107)
    python -m medrt.models.ceiling --seed 9000 --series 12   # the held-out series the cards measure

Each lesion section's contrast-to-noise ratio over its area is

    CNR = |contrast| / sigma * sqrt(area_px / A),   A = 4 pi NOISE_BLUR_PX^2 (about 8 px)

(``contrast``: the mean the phantom added inside the mask, ``LesionTruth.contrast``;
``sigma``: the series' quantum noise, :func:`medrt.phantom.ct.noise_sigma`, white noise
blurred by :data:`~medrt.phantom.ct.NOISE_BLUR_PX`, so ``A`` is the area of one independent
sample). An observer that knows every lesion's shape but not its place, and may mark
``--fp`` false lesions per slice among the slice's ``pixels / A`` independent places,
must call a place a lesion from ``z = Phi^-1(1 - fp / (pixels / A))`` (4.4 for 0.2 on a
512² slice), and finds a section with probability ``Phi(CNR - z)``. The ceiling of a
bucket is the sum of those probabilities. Two such observers: ``slice`` reads each slice
alone; ``series`` adds a lesion's sections on all its slices (their noise is independent,
so its CNR is their root sum of squares) and, once it has found the lesion, marks every
section of it: the bound for a 2.5-D or 3-D network. It leaves out the anatomy (organ edges,
vessels, texture) that a real detector must also tell lesions from, so it is an upper
bound, and a loose one for large lesions over textured tissue. The same observer as an
ROI classifier (``--specificity``): a 512² slice is one crop, so a lesion is covered when
its slice is called positive: when any of its lesions is found, or a false call is made
there (as on a lesion-free slice, with probability 1 - specificity).

Why it exists (eighteenth session, docs/models-log.md): on the validation series every
2-5 mm section under CNR 4 was missed, and half of them are under it: the 0.85 target
for 2-5 mm CT lesions is above this ceiling, whatever the network.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from typing import Any

from scipy.stats import norm

from medrt.evaluation import BUCKETS, bucket_of
from medrt.phantom import generate_ct_series
from medrt.phantom.ct import NOISE_BLUR_PX, noise_sigma

SAMPLE_PX = 4.0 * math.pi * NOISE_BLUR_PX**2  # the area of one independent noise sample


def section_cnr(contrast: float, area_px: float, sigma: float) -> float:
    """A section's CNR over its area (module docstring)."""
    return abs(contrast) / sigma * math.sqrt(area_px / SAMPLE_PX)


def threshold_z(fp_per_slice: float, pixels: int) -> float:
    """The CNR an observer must call a lesion from to keep ``fp_per_slice`` false marks
    over a slice of ``pixels`` pixels (``pixels / SAMPLE_PX`` independent places)."""
    places = pixels / SAMPLE_PX
    return float(norm.isf(fp_per_slice / places))


def ceiling(seed: int = 5000, n_series: int = 8, n_frames: int = 40, size: int = 512,
            fp_per_slice: float = 0.2, specificity: float = 0.9) -> dict[str, Any]:
    """The ceiling on CT series ``seed + 100 + s`` as ``models/evaluate.py`` draws them,
    for two observers: ``slice``, each slice alone, and ``series``, which adds a lesion's
    sections on all its slices in quadrature (its CNR is the root sum of squares: the
    slices' noise is independent) and, having found the lesion, marks every section of it.
    Each gives the rate per size bucket of sections, of lesions (3-D: sized by their
    longest section, found when any section is) and per contrast class; and ``coverage``,
    the ROI classifier's (module docstring) at ``specificity``."""
    if not 0.0 < fp_per_slice:
        raise ValueError(f'Argument "fp_per_slice" must be > 0, got {fp_per_slice!r}')
    if not 0.0 < specificity < 1.0:
        raise ValueError(f'Argument "specificity" must be in (0, 1), got {specificity!r}')
    z = threshold_z(fp_per_slice, size * size)
    z_frame = threshold_z(-math.log(specificity), size * size)  # no false call: exp(-rate) = specificity
    slices: list[list[tuple[tuple[int, int], float, str, float]]] = []  # per slice: (lesion, mm, kind, CNR)
    for s in range(n_series):
        series_seed = seed + 100 + s
        sigma = noise_sigma(series_seed, n_frames, size)
        for frame in generate_ct_series(series_seed, n_frames=n_frames, size=size):
            px_mm2 = frame.spacing_mm[0] * frame.spacing_mm[1]
            slices.append([((s, les.label), les.diameter_mm, les.kind,
                            section_cnr(les.contrast, les.area_mm2 / px_mm2, sigma))
                           for les in frame.lesions if not les.extras.get("ignore")])
    squares: dict[tuple[int, int], float] = defaultdict(float)
    longest: dict[tuple[int, int], float] = defaultdict(float)
    for sections in slices:
        for key, mm, _, cnr in sections:
            squares[key] += cnr * cnr
            longest[key] = max(longest[key], mm)
    whole = {key: math.sqrt(v) for key, v in squares.items()}  # the series observer's CNR per lesion

    def rows(groups: dict[str, list[float]], names: list[str]) -> list[dict[str, Any]]:
        return [{"name": n, "lesions": len(groups[n]), "ceiling": round(sum(groups[n]), 1),
                 "rate": round(sum(groups[n]) / len(groups[n]), 3) if groups[n] else None} for n in names]

    names = [b for b, _ in BUCKETS]
    out: dict[str, Any] = {"seed": seed, "series": n_series, "fp_per_slice": fp_per_slice, "z": round(z, 2)}
    for observer in ("slice", "series"):
        def found(key: tuple[int, int], cnr: float, zz: float, observer: str = observer) -> float:
            return float(norm.cdf((cnr if observer == "slice" else whole[key]) - zz))

        by_bucket: dict[str, list[float]] = defaultdict(list)
        kinds: dict[str, list[float]] = defaultdict(list)
        missed: dict[tuple[int, int], float] = defaultdict(lambda: 1.0)
        covered: list[float] = []  # per section: P(its slice is called positive)
        for sections in slices:
            # called negative: no lesion found and no false call elsewhere in the slice
            quiet = specificity * math.prod(1.0 - found(key, cnr, z_frame) for key, _, _, cnr in sections)
            covered += [1.0 - quiet] * len(sections)
            for key, mm, kind, cnr in sections:
                p = found(key, cnr, z)
                by_bucket[bucket_of(mm)].append(p)
                kinds[kind].append(p)
                missed[key] *= 1.0 - p
        by_lesion: dict[str, list[float]] = defaultdict(list)
        for key, miss in missed.items():
            # the series observer finds a lesion once, from all its slices; the slice observer on any slice
            lesion = float(norm.cdf(whole[key] - z)) if observer == "series" else 1.0 - miss
            by_lesion[bucket_of(longest[key])].append(lesion)
        large = [p for b in names if b != "2-5" for p in by_bucket[b]]
        large_3d = [p for b in names if b != "2-5" for p in by_lesion[b]]
        out[observer] = {
            "sections": rows(by_bucket, names) + rows({">=5": large}, [">=5"]),
            "lesions": rows(by_lesion, names) + rows({">=5": large_3d}, [">=5"]),
            "kinds": rows(kinds, sorted(kinds)),
            "coverage": {"specificity": specificity, "z": round(z_frame, 2), "lesions": len(covered),
                         "ceiling": round(sum(covered), 1),
                         "rate": round(sum(covered) / len(covered), 3) if covered else None}}
    return out


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m medrt.models.ceiling`` (tests/test_docs_commands.py parses the
    docs' commands with it)."""
    p = argparse.ArgumentParser(prog="python -m medrt.models.ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=5000, help="5000: the validation series; 9000: the held-out ones")
    p.add_argument("--series", type=int, default=8)
    p.add_argument("--frames", type=int, default=40, help="slices per series")
    p.add_argument("--fp", type=float, default=0.2, help="false positives allowed per slice")
    p.add_argument("--specificity", type=float, default=0.9,
                   help="the classifier's specificity on lesion-free slices, for its coverage ceiling")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.fp <= 0 or not 0 < args.specificity < 1:
        p.error("--fp must be > 0 and --specificity in (0, 1)")
    out = ceiling(args.seed, args.series, args.frames, fp_per_slice=args.fp, specificity=args.specificity)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"CT sensitivity ceiling at {args.fp} false positives per slice (z = {out['z']}), "
          f"series {args.seed + 100}..{args.seed + 99 + args.series}:")
    for observer, what_it_is in (("slice", "each slice alone"), ("series", "a lesion's slices together")):
        print(f" {observer} observer ({what_it_is}):")
        for what in ("sections", "lesions", "kinds"):
            cells = ", ".join(f"{r['name']} {r['rate']} ({r['ceiling']} of {r['lesions']})"
                              for r in out[observer][what])
            print(f"  {what}: {cells}")
        cov = out[observer]["coverage"]
        print(f"  ROI classifier coverage at specificity {cov['specificity']} (z = {cov['z']}): "
              f"{cov['rate']} ({cov['ceiling']} of {cov['lesions']} lesion sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
