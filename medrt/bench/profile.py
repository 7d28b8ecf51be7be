"""Where a model spends its time: ONNX Runtime's own per-node profile, slowest nodes first.

The profiled session is :class:`medrt.engine.backends.onnxrt.OnnxRuntimeBackend`'s own,
made with its ``profile_prefix`` (ORT's profiler on) and otherwise as medrt makes it on
the CPU: the graph it loads (an FP32 UNet's skip-connection ``Concat`` convolutions as
sums of convolutions, :func:`medrt.engine.rewrite.concat_as_sum`), its threads, session
options and IO binding, so the nodes are the ones that really run, after ORT's own
fusions (``FusedConv``, ``Conv`` in NCHWc, reorders). The file's graph would show the
``Concat`` nodes the session no longer has and miss the convolutions that replaced them.
Which graph ran is in :attr:`LayerProfile.graph`.
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

__all__ = ["LayerProfile", "profile_layers", "parse_profile", "format_profile", "format_graph"]

log = logging.getLogger(__name__)

KERNEL_SUFFIX = "_kernel_time"


class LayerProfile(list):
    """:func:`profile_layers`' rows (a list, as JSON writes it) and ``graph``, the graph
    they are of: ``{"model", "shape", "threads", "runs", "rewritten", "rewrites"}``,
    ``rewritten`` true when the session ran another graph than the file's and
    ``rewrites`` each rewrite's replaced nodes (``{"concat_as_sum": [Concat names]}``)."""

    def __init__(self, rows: Sequence[dict[str, Any]], graph: dict[str, Any]) -> None:
        super().__init__(rows)
        self.graph = graph


def profile_layers(
    model: str = "lesion_unet_dx",
    shape: tuple[int, int] = (1024, 1024),
    runs: int = 5,
    top: int = 15,
    threads: int | None = None,
    split_concats: bool = True,
) -> LayerProfile:
    """The ``top`` slowest nodes of ``model`` at ``shape`` on ONNX Runtime CPU, in the
    session medrt runs it in (module docstring; ``split_concats=False``: the file's graph).

    The model runs ``runs`` + 1 times on one random input; the first run is the
    warm-up and is not counted. Each row is ``{"node", "op_type", "total_ms",
    "mean_ms", "share"}``: total over the counted runs, mean per call, and the
    share of all kernel time in those runs. Sorted by ``total_ms``, descending.
    """
    from medrt.engine.backends.onnxrt import OnnxRuntimeBackend
    from medrt.engine.registry import find_spec

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
        backend = OnnxRuntimeBackend(spec, device="cpu", threads=threads, reuse_outputs=True,
                                     split_concats=split_concats, profile_prefix=str(Path(tmp) / "ort"))
        for _ in range(runs + 1):  # as medrt runs it: the first call plain, then through the IO binding
            backend.infer(x)
        trace = Path(backend.session.end_profiling())
        if not trace.is_absolute():  # older onnxruntime may return the bare name
            trace = Path(tmp) / trace.name
        events = json.loads(trace.read_text(encoding="utf-8"))
    graph = {"model": spec.ident, "shape": [int(s) for s in shape], "threads": backend.threads, "runs": runs,
             "rewritten": bool(backend.rewritten), "rewrites": {"concat_as_sum": list(backend.rewritten)}}
    del backend
    rows = parse_profile(events, skip_runs=1)
    log.info("profiled %s at %s: %d nodes, %d runs counted, %d Concat rewritten as sums", spec.ident, tuple(shape),
             len(rows), runs, len(graph["rewrites"]["concat_as_sum"]))
    return LayerProfile(rows[:top], graph)


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


def format_graph(graph: dict[str, Any]) -> str:
    """One line for people: which graph :func:`profile_layers` profiled."""
    concats = graph.get("rewrites", {}).get("concat_as_sum", [])
    if graph.get("rewritten"):
        return (f"graph: as medrt's CPU session runs it, rewritten ({len(concats)} skip-connection Concat as sums "
                "of convolutions, concat_as_sum); not the file's")
    return "graph: the model file's, as it is"
