"""``medrt bench``: measured figures, as ratios against a baseline taken in the same run."""

from __future__ import annotations

import argparse
import json


def run(args: argparse.Namespace) -> int:
    from medrt.bench import run_decode_bench

    results = {"decode": run_decode_bench(size=args.size, repeats=args.repeats)}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        d = results["decode"]
        print(f"decode benchmark: {d['size']}x{d['size']} uint16, median of {d['repeats']} runs")
        for row in d["rows"]:
            print(
                f"  {row['syntax']:<28} pydicom pixel_array {row['pydicom_ms']:8.1f} ms"
                f"   medrt Frame {row['medrt_ms']:8.1f} ms   ratio {row['ratio']:.2f}x"
            )
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="benchmarks, measured as ratios in one run",
        description="Benchmarks measured side by side in one run. Available suite: decode "
        "(medrt Frame decoding against pydicom's bare pixel_array on the same file).",
    )
    p.add_argument("--only", choices=["decode"], default="decode", help="which suite to run")
    p.add_argument("--size", type=int, default=4096, help="frame size for the decode suite")
    p.add_argument("--repeats", type=int, default=9, help="repeats per measurement (median is reported)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
