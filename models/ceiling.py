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
bucket is the sum of those probabilities. It leaves out the anatomy (organ edges,
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
    """The ceiling per size bucket (sections), per lesion (3-D: found when any section
    is) and per contrast class, on CT series ``seed + 100 + s`` as
    ``models/evaluate.py`` draws them; and ``coverage``, the ROI classifier's: a 512²
    slice is one crop, so a lesion is covered when its slice is called positive, which
    the observer does when it finds any lesion there, kept to ``specificity`` on
    lesion-free slices (no false call in a slice with probability ``specificity``:
    ``-ln(specificity)`` false calls per slice)."""
    z = threshold_z(fp_per_slice, size * size)
    z_frame = threshold_z(-math.log(specificity), size * size)
    covered: list[float] = []  # per scored section: P(its slice is called positive)
    sections: dict[str, list[float]] = defaultdict(list)  # bucket -> P(found) per section
    kinds: dict[str, list[float]] = defaultdict(list)
    lesions: dict[tuple[int, int], dict[str, Any]] = {}
    for s in range(n_series):
        series_seed = seed + 100 + s
        sigma = noise_sigma(series_seed, n_frames, size)
        for frame in generate_ct_series(series_seed, n_frames=n_frames, size=size):
            px_mm2 = frame.spacing_mm[0] * frame.spacing_mm[1]
            scored = [les for les in frame.lesions if not les.extras.get("ignore")]
            # called negative: no lesion found and no false call elsewhere in the slice
            quiet = specificity * math.prod(
                float(norm.sf(section_cnr(les.contrast, les.area_mm2 / px_mm2, sigma) - z_frame)) for les in scored)
            covered += [1.0 - quiet] * len(scored)
            for les in scored:
                p = float(norm.cdf(section_cnr(les.contrast, les.area_mm2 / px_mm2, sigma) - z))
                sections[bucket_of(les.diameter_mm)].append(p)
                kinds[les.kind].append(p)
                one = lesions.setdefault((s, les.label), {"d": 0.0, "miss": 1.0})
                one["d"] = max(one["d"], les.diameter_mm)
                one["miss"] *= 1.0 - p
    by_lesion: dict[str, list[float]] = defaultdict(list)
    for one in lesions.values():
        by_lesion[bucket_of(one["d"])].append(1.0 - one["miss"])

    def rows(groups: dict[str, list[float]], names: list[str]) -> list[dict[str, Any]]:
        return [{"name": n, "lesions": len(groups[n]), "ceiling": round(sum(groups[n]), 1),
                 "rate": round(sum(groups[n]) / len(groups[n]), 3) if groups[n] else None} for n in names]

    names = [b for b, _ in BUCKETS]
    large = [p for b in names if b != "2-5" for p in sections[b]]
    large_3d = [p for b in names if b != "2-5" for p in by_lesion[b]]
    return {"seed": seed, "series": n_series, "fp_per_slice": fp_per_slice, "z": round(z, 2),
            "sections": rows(sections, names) + rows({">=5": large}, [">=5"]),
            "lesions": rows(by_lesion, names) + rows({">=5": large_3d}, [">=5"]),
            "kinds": rows(kinds, sorted(kinds)),
            "coverage": {"specificity": specificity, "z": round(z_frame, 2), "lesions": len(covered),
                         "ceiling": round(sum(covered), 1),
                         "rate": round(sum(covered) / len(covered), 3) if covered else None}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medrt.models.ceiling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=5000, help="5000: the validation series; 9000: the held-out ones")
    p.add_argument("--series", type=int, default=8)
    p.add_argument("--frames", type=int, default=40, help="slices per series")
    p.add_argument("--fp", type=float, default=0.2, help="false positives allowed per slice")
    p.add_argument("--specificity", type=float, default=0.9,
                   help="the classifier's specificity on lesion-free slices, for its coverage ceiling")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = ceiling(args.seed, args.series, args.frames, fp_per_slice=args.fp, specificity=args.specificity)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"CT sensitivity ceiling at {args.fp} false positives per slice (z = {out['z']}), "
          f"series {args.seed + 100}..{args.seed + 99 + args.series}:")
    for what in ("sections", "lesions", "kinds"):
        cells = ", ".join(f"{r['name']} {r['rate']} ({r['ceiling']} of {r['lesions']})" for r in out[what])
        print(f"  {what}: {cells}")
    cov = out["coverage"]
    print(f"  ROI classifier coverage at specificity {cov['specificity']} (z = {cov['z']}): "
          f"{cov['rate']} ({cov['ceiling']} of {cov['lesions']} lesion sections)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
