"""Where a model spends its time: ONNX Runtime's own per-node profile, slowest nodes first.

The session is built like :class:`medrt.engine.backends.onnxrt.OnnxRuntimeBackend`
builds it on the CPU (same threads, same graph optimisation), so the nodes are
the fused ones that really run (``FusedConv``, ``Conv`` in NCHWc, reorders).
ORT writes a chrome-trace JSON; its ``Node`` events named ``*_kernel_time`` are
the kernels. The first run is a warm-up and is left out.
"""

from __future__ import annotations

import bisect
import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["profile_layers", "parse_profile", "format_profile"]

log = logging.getLogger(__name__)

KERNEL_SUFFIX = "_kernel_time"


def profile_layers(
    model: str = "lesion_unet_dx",
    shape: tuple[int, int] = (1024, 1024),
    runs: int = 5,
    top: int = 15,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """The ``top`` slowest nodes of ``model`` at ``shape`` on ONNX Runtime CPU.

    The model runs ``runs`` + 1 times on one random input; the first run is the
    warm-up and is not counted. Each row is ``{"node", "op_type", "total_ms",
    "mean_ms", "share"}``: total over the counted runs, mean per call, and the
    share of all kernel time in those runs. Sorted by ``total_ms``, descending.
    """
    import onnxruntime as ort

    from medrt.bands import usable_cores
    from medrt.engine.registry import ModelError, find_spec

    if runs < 1:
        raise ValueError(f'Argument "runs" must be >= 1, got {runs!r}.')
    if top < 1:
        raise ValueError(f'Argument "top" must be >= 1, got {top!r}.')
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f'Argument "shape" must be (height, width) in pixels, got {shape!r}.')
    spec = find_spec(model)
    if spec.multiple_of > 1 and any(s % spec.multiple_of for s in shape):
        raise ValueError(f'Argument "shape" {tuple(shape)} must be a multiple of {spec.multiple_of} '
                         f"for {spec.ident}.")
    x = np.random.default_rng(0).random((1, spec.slices, *shape), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="medrt-profile-") as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or usable_cores()
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "ort")
        try:
            session = ort.InferenceSession(str(spec.path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelError(f"{spec.path}: onnxruntime cannot load the model ({exc})") from exc
        feed = {spec.inputs[0].name: x}
        for _ in range(runs + 1):
            session.run(None, feed)
        trace = Path(session.end_profiling())
        if not trace.is_absolute():  # older onnxruntime may return the bare name
            trace = Path(tmp) / trace.name
        events = json.loads(trace.read_text(encoding="utf-8"))
    rows = parse_profile(events, skip_runs=1)
    log.info("profiled %s at %s: %d nodes, %d runs counted", spec.ident, tuple(shape), len(rows), runs)
    return rows[:top]


def parse_profile(events: Sequence[dict[str, Any]], skip_runs: int = 1) -> list[dict[str, Any]]:
    """Every node's kernel time from an ORT chrome trace, slowest first, leaving out the
    first ``skip_runs`` ``model_run`` spans (shares are of the kernel time kept)."""
    runs = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                  for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [r[0] for r in runs]
    totals: dict[str, list[Any]] = {}  # node -> [op_type, total_us, calls]
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        i = bisect.bisect_right(starts, float(e["ts"])) - 1  # the run this event started in
        if i < skip_runs and runs:
            continue
        node = name[: -len(KERNEL_SUFFIX)]
        row = totals.setdefault(node, [str(e.get("args", {}).get("op_name", "?")), 0.0, 0])
        row[1] += float(e.get("dur", 0))
        row[2] += 1
    grand = sum(r[1] for r in totals.values()) or 1.0
    rows = [{"node": node, "op_type": op, "total_ms": round(us / 1000.0, 3), "mean_ms": round(us / calls / 1000.0, 3),
             "share": round(us / grand, 4)}
            for node, (op, us, calls) in totals.items()]
    rows.sort(key=lambda r: r["total_ms"], reverse=True)
    return rows


def format_profile(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned table for people, with the share each takes."""
    if not rows:
        return "no node timings (was the model run?)"
    width = min(60, max(len("node"), *(len(r["node"]) for r in rows)))
    op_width = max(len("op"), *(len(r["op_type"]) for r in rows))
    head = f"{'node':<{width}}  {'op':<{op_width}}  {'total ms':>9}  {'mean ms':>8}  {'share':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        node = r["node"] if len(r["node"]) <= width else "…" + r["node"][-(width - 1):]
        lines.append(f"{node:<{width}}  {r['op_type']:<{op_width}}  {r['total_ms']:>9.2f}  {r['mean_ms']:>8.3f}"
                     f"  {r['share']:>6.1%}")
    lines.append(f"{'shown':<{width}}  {'':<{op_width}}  {sum(r['total_ms'] for r in rows):>9.2f}  {'':>8}"
                 f"  {sum(r['share'] for r in rows):>6.1%}")
    return "\n".join(lines)
