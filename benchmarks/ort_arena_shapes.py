"""RSS of onnxruntime's CPU arenas over many frame sizes, as the viewer and the listener see
them: the ROI classifier at 256², then ``lesion_unet`` and ``lesion_unet_lite`` taking turns
on 30 random sizes (256-2048 a side, multiples of 32), ``--passes`` times over the same
sizes. Run each kind in a process of its own (the arena is the process's):

    .venv/bin/python benchmarks/ort_arena_shapes.py shared|own [--shrink] [--via infer|run] [--models lesion_unet]

``shared``: the process's one arena (medrt's default); ``own``: an arena per session.
``--shrink`` adds ORT's ``memory.enable_memory_arena_shrinkage`` run option to every run
(through medrt's IO binding, ``--via infer``, only a shape's later runs take it: the first
goes through ``session.run``); ``--via run`` calls ``session.run`` itself. Prints the RSS at
the end of each pass, the peak (VmHWM) and the time.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import onnxruntime as ort

from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import find_spec


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        return int(fh.read().split(f"{key}:")[1].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("shared", "own"))
    parser.add_argument("--shrink", action="store_true")
    parser.add_argument("--via", choices=("infer", "run"), default="infer")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--models", default="lesion_unet,lesion_unet_lite", help="the segmenters taking turns")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sizes = [tuple(int(v) for v in rng.integers(8, 65, 2) * 32) for _ in range(30)]
    roi = OnnxRuntimeBackend(find_spec("roi_classifier"), shared_arena=args.kind == "shared")
    segs = [OnnxRuntimeBackend(find_spec(m), shared_arena=args.kind == "shared") for m in args.models.split(",")]
    options = ort.RunOptions()
    if args.shrink:
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        for b in (roi, *segs):
            b.session.run_with_iobinding = functools.partial(b.session.run_with_iobinding, run_options=options)

    def run(b: OnnxRuntimeBackend, hw: tuple[int, int]) -> None:
        x = rng.standard_normal((1, b.spec.inputs[0].shape[1], *hw), dtype=np.float32)
        if args.via == "run":
            b.session.run(b.output_names, {b.input_name: x}, options)
        else:
            b.infer(x)

    start, t0, ends = _status_mb("VmRSS"), time.perf_counter(), []
    for _ in range(args.passes):
        for i, hw in enumerate(sizes):
            run(roi, (256, 256))
            run(segs[i % len(segs)], hw)
        ends.append(round(_status_mb("VmRSS")))
    print(f"{args.kind}{' shrink' if args.shrink else ''} via {args.via}: RSS {start:.0f} MB at the start, {ends} "
          f"after each pass, peak {_status_mb('VmHWM'):.0f}; {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
