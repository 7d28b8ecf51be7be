"""The shipped models on onnxruntime's CPU provider, sessions with the process's shared arena
(medrt's default, :func:`medrt.engine.backends.onnxrt.shared_cpu_arena`) and sessions with
an arena each (``shared_arena=False``), side by side in one process on the shapes the
analysis runs: the ROI classifier's thumbnail, a UNet's 1024² crop or 512² CT slice, and
recheck windows. The two kinds take turns, frame by frame, so the machine's noise falls on
both; medians after two warm-up rounds.

    .venv/bin/python benchmarks/ort_arena.py [--rounds 12]

Memory is measured where it matters, in a whole process:
``medrt bench --only listener_memory --series 8``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
from medrt.engine.registry import find_spec

SHAPES = {"roi_classifier": [(256, 256)], "lesion_unet": [(1024, 1024), (64, 64), (96, 128)],
          "lesion_unet_lite": [(512, 512), (32, 32), (64, 48)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    kinds = {shared: {name: OnnxRuntimeBackend(find_spec(name), shared_arena=shared) for name in SHAPES}
             for shared in (False, True)}
    ms: dict[tuple[bool, str, tuple[int, int]], list[float]] = {
        (shared, name, hw): [] for shared in kinds for name in SHAPES for hw in SHAPES[name]}
    for r in range(args.rounds):
        for shared in ((False, True) if r % 2 else (True, False)):
            for name, shapes in SHAPES.items():
                backend = kinds[shared][name]
                for hw in shapes:
                    x = rng.standard_normal((1, backend.spec.inputs[0].shape[1], *hw), dtype=np.float32)
                    t0 = time.perf_counter()
                    backend.infer(x)
                    if r >= 2:
                        ms[(shared, name, hw)].append((time.perf_counter() - t0) * 1000)
    print(f"{'model':18s} {'shape':>11s} {'own arena':>10s} {'shared':>10s} {'ratio':>6s}")
    for name, shapes in SHAPES.items():
        for hw in shapes:
            own, shared = statistics.median(ms[(False, name, hw)]), statistics.median(ms[(True, name, hw)])
            print(f"{name:18s} {hw[0]:>5d}x{hw[1]:<5d} {own:8.2f}ms {shared:8.2f}ms {shared / own:6.3f}")


if __name__ == "__main__":
    main()
