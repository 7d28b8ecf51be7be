"""onnxruntime's memory pattern (``SessionOptions.enable_mem_pattern``) on and off, on the CPU
with medrt's sessions (the process's one arena, IO binding), in three cases:

- ``lite512``: ``lesion_unet_lite`` on one 512² slice again and again (the 30 fps stream);
- ``dx1024``: ``lesion_unet_dx`` on one 1024² crop again and again;
- ``shapes``: the ROI classifier at 256², then ``lesion_unet`` and ``lesion_unet_lite``
  taking turns on 30 random sizes (256-2048 a side, multiples of 32), as
  ``benchmarks/ort_arena_shapes.py`` runs them: radiographs, recheck windows and crops of
  many sizes, as the viewer and the listener see them.

``speed``: both settings in one process, taking turns run by run (in the shapes case size
by size; who goes first swapped every time), so the machine's noise falls on both. After a
warm-up round (every shape seen once: the pattern is planned on a shape's first run and used
from its second): the median run (fixed cases, ``--rounds`` x ``--runs`` runs) or pass over
the sizes (``--rounds`` passes), and the median of the paired ratios off/on (each run or size
against its twin run beside it), which a slow drift of the machine's load leaves alone.

``rss``: each case and setting in a process of its own (the arena is the process's),
``--passes`` rounds, the RSS after each and the peak (VmHWM); the settings take turns.

    .venv/bin/python benchmarks/ort_mem_pattern.py speed [--rounds 6] [--runs 6] [--cases lite512,dx1024,shapes]
    .venv/bin/python benchmarks/ort_mem_pattern.py rss [--passes 3] [--cases lite512,dx1024,shapes]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import find_spec

CASES = ("lite512", "dx1024", "shapes")
SETTINGS = {"on": True, "off": False}


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        return int(fh.read().split(f"{key}:")[1].split()[0]) / 1024


def _sizes() -> list[tuple[int, int]]:
    rng = np.random.default_rng(0)  # the sizes of benchmarks/ort_arena_shapes.py
    return [tuple(int(v) for v in rng.integers(8, 65, 2) * 32) for _ in range(30)]


def _case(case: str, mem_pattern: bool) -> list[Callable[[], None]]:
    """The steps of one round of ``case`` on sessions made with ``mem_pattern``: one run of
    a fixed shape; in the shapes case one a size (the ROI classifier, then a segmenter)."""
    rng = np.random.default_rng(1)

    def frame(b: OnnxRuntimeBackend, hw: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal((1, b.spec.inputs[0].shape[1], *hw), dtype=np.float32)

    if case in ("lite512", "dx1024"):
        name, hw = {"lite512": ("lesion_unet_lite", (512, 512)), "dx1024": ("lesion_unet_dx", (1024, 1024))}[case]
        b = OnnxRuntimeBackend(find_spec(name), mem_pattern=mem_pattern)
        x = frame(b, hw)
        return [lambda: b.infer(x)]
    roi = OnnxRuntimeBackend(find_spec("roi_classifier"), mem_pattern=mem_pattern)
    segs = [OnnxRuntimeBackend(find_spec(m), mem_pattern=mem_pattern) for m in ("lesion_unet", "lesion_unet_lite")]
    thumb = frame(roi, (256, 256))

    def step(seg: OnnxRuntimeBackend, x: np.ndarray) -> Callable[[], None]:
        def run() -> None:
            roi.infer(thumb)
            seg.infer(x)
        return run

    return [step(segs[i % 2], frame(segs[i % 2], hw)) for i, hw in enumerate(_sizes())]


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def speed(args: argparse.Namespace) -> None:
    for case in args.cases.split(","):
        steps = {s: _case(case, on) for s, on in SETTINGS.items()}
        n = len(steps["on"])
        runs = args.runs if n == 1 else 1
        ms: dict[str, list[list[float]]] = {s: [] for s in SETTINGS}  # a row per round, a time per step
        for r in range(args.rounds * runs + 1):
            got: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for k in range(n):  # the settings take turns step by step, who goes first swapped each time
                for s in (("on", "off") if (r + k) % 2 else ("off", "on")):
                    got[s].append(_timed(steps[s][k]))
            if r:  # round 0 is the warm-up: every shape's first run
                for s in SETTINGS:
                    ms[s].append(got[s])
        total = {s: [sum(row) for row in ms[s]] for s in SETTINGS}
        paired = [off / on for a, b in zip(ms["on"], ms["off"], strict=True) for on, off in zip(a, b, strict=True)]
        on, off = statistics.median(total["on"]), statistics.median(total["off"])
        what = f"pass over {n} sizes" if n > 1 else "run"
        print(f"{case:8s} median {what}: on {on:8.1f} ms, off {off:8.1f} ms, off/on {off / on:.3f}; "
              f"median of {len(paired)} paired off/on {statistics.median(paired):.3f} "
              f"(on {min(total['on']):.1f}-{max(total['on']):.1f}, off {min(total['off']):.1f}-"
              f"{max(total['off']):.1f})", flush=True)


def rss_one(args: argparse.Namespace) -> None:
    start = _status_mb("VmRSS")
    steps = _case(args.case, SETTINGS[args.setting])
    loaded, ends, t0 = _status_mb("VmRSS"), [], time.perf_counter()
    for _ in range(args.passes):
        for _ in range(args.runs if len(steps) == 1 else 1):
            for step in steps:
                step()
        ends.append(round(_status_mb("VmRSS")))
    print(f"{args.case:8s} {args.setting:3s}: RSS {start:.0f} MB at the start, {loaded:.0f} loaded, {ends} after "
          f"each pass, peak {_status_mb('VmHWM'):.0f}; {time.perf_counter() - t0:.1f} s", flush=True)


def rss(args: argparse.Namespace) -> None:
    for case in args.cases.split(","):
        for setting in SETTINGS:
            subprocess.run([sys.executable, __file__, "rss-one", case, setting, "--passes", str(args.passes),
                            "--runs", str(args.runs)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("speed")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=6, help="a fixed case's runs for each pass over the sizes")
    p.add_argument("--cases", default=",".join(CASES))
    p.set_defaults(fn=speed)
    p = sub.add_parser("rss")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--runs", type=int, default=10, help="runs in a fixed case's pass")
    p.add_argument("--cases", default=",".join(CASES))
    p.set_defaults(fn=rss)
    p = sub.add_parser("rss-one", help="one case and setting in this process (rss runs it)")
    p.add_argument("case", choices=CASES)
    p.add_argument("setting", choices=tuple(SETTINGS))
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.set_defaults(fn=rss_one)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
