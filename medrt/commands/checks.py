"""``medrt checks``: whether this installation can do its work (:mod:`medrt.checks`)."""

from __future__ import annotations

import argparse
import json

from medrt.commands.options import add_runtime_options

__all__ = ["register", "run"]


def run(args: argparse.Namespace) -> int:
    from medrt.checks import failed, run_checks

    models = [m.strip() for m in args.model.split(",") if m.strip()] if args.model else None
    rows = run_checks(models, backend=args.backend, device=args.device, precision=args.precision)
    bad = failed(rows)
    if args.json:
        print(json.dumps({"ok": not bad, "rows": [r.to_json() for r in rows]}, indent=2))
        return 1 if bad else 0
    width = max(len(r.item) for r in rows)
    area = None
    for r in rows:
        if r.area != area:
            area = r.area
            print(f"{area}:")
        print(f"  {r.status:<8} {r.item:<{width}}  {r.detail}")
    if bad:
        print(f"\n{len(bad)} required check(s) failed: " + "; ".join(f"{r.area} {r.item}" for r in bad))
        return 1
    print("\nall required checks passed")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "checks",
        help="check this installation: runtime and device, model files, decoders, optional parts",
        description="Check this installation before any image arrives: the runtime and device the analysis will "
        "use (and why, when it falls back), each model file against its spec's sha256, a decoder for every common "
        "transfer syntax, the encoders the outputs need, the optional parts (viewer, Ray, TensorRT, ...) and the "
        "cache folder, each with what to install where something is missing. Loads no model and reads no "
        "patient data. Exit status 1 when a required check fails (a model whose file does not match its spec, a "
        "transfer syntax with no decoder, no runtime for the request).",
    )
    p.add_argument("--model", default=None, metavar="NAMES",
                   help="models to check, comma-separated names or .toml specs (default: the analyzer's default "
                        "ROI classifiers and segmenters)")
    add_runtime_options(p)  # the setting to check for, as the analysis commands take it
    p.add_argument("--json", action="store_true", help="print one JSON object for programs")
    p.set_defaults(func=run)
