"""Telemetry for people: the summary table and the latency histogram PNG.

matplotlib draws the histogram when it is installed; otherwise PIL does, so the
PNG always exists (batch reports link it).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from medrt.pipeline.telemetry import _stats

__all__ = ["format_summary", "histogram_matplotlib", "histogram_pil", "histogram_png"]


def format_summary(summary: Mapping[str, Any]) -> str:
    """A :meth:`Telemetry.summary` dict as aligned plain text."""

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    rows = [("end to end", summary["e2e_ms"])] + [(f"stage {k}", v) for k, v in summary["stages_ms"].items()]
    # per-frame timings (the analyzer's steps); steps that never ran (all zero) are left out
    # (a step named like a stage repeats that stage's row, so only the others are shown)
    rows += [(f"  step {k}", v) for k, v in summary["timings_ms"].items()
             if v["max"] and k not in summary["stages_ms"]]
    width = max(len(name) for name, _ in rows)
    head = f"{'latency ms':<{width}}  {'n':>7}  {'p50':>8}  {'p95':>8}  {'p99':>8}  {'max':>8}  {'mean':>8}"
    lines = [head, "-" * len(head)]
    for name, st in rows:
        cells = "  ".join(f"{ms(st[k]):>8}" for k in ("p50", "p95", "p99", "max", "mean"))
        lines.append(f"{name:<{width}}  {st['n']:>7}  {cells}")
    fps = summary["fps"]
    lines.append("")
    lines.append(f"frames {summary['frames']} (warm-up {summary['warmup']}, dropped {summary['frames_dropped']}), "
                 f"{'-' if fps is None else f'{fps:.1f}'} fps over {summary['elapsed_s']:.1f} s")
    for name, e in summary["edges"].items():
        mean = "-" if e["depth_mean"] is None else f"{e['depth_mean']:.1f}"
        lines.append(f"queue {name}: depth max {e['depth_max']} mean {mean}, "
                     f"dropped {e['drops']}, rejected {e['rejects']}")
    errors = {k: v for k, v in summary["errors"].items() if v}
    lines.append("errors: " + (", ".join(f"{k} {v}" for k, v in errors.items()) if errors else "none"))
    m = summary["memory"]
    growth = "-" if m["rss_growth_pct"] is None else f"{m['rss_growth_pct']:+.1f}%"
    lines.append(f"rss MB ({m['rss_source']}): first {m['rss_first_mb']}, after warm-up {m['rss_after_warmup_mb']}, "
                 f"last {m['rss_last_mb']}, max {m['rss_max_mb']}, growth {growth}")
    if m["gpu_last_mb"] is not None:
        lines.append(f"gpu MB ({m['gpu_source']}): last {m['gpu_last_mb']}, max {m['gpu_max_mb']}")
    return "\n".join(lines)


# -- histogram ------------------------------------------------------------------


def _histogram_title(values: Sequence[float], stage: str) -> tuple[str, float, float]:
    st = _stats(values)
    if not values:
        return f"{stage} latency: no samples", st["p50"], st["p99"]
    return f"{stage} latency  n={st['n']}  p50 {st['p50']:.1f} ms  p99 {st['p99']:.1f} ms", st["p50"], st["p99"]


def histogram_matplotlib(values: Sequence[float], stage: str, size: tuple[int, int]) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    title, p50, p99 = _histogram_title(values, stage)
    fig = Figure(figsize=(size[0] / 100, size[1] / 100), dpi=100)  # no pyplot: no global state
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if values:
        ax.hist(values, bins=_bins(len(values)), color="#4c72b0")
        ax.axvline(p50, color="#2a9d3f", linestyle="--", label=f"p50 {p50:.1f} ms")
        ax.axvline(p99, color="#d62728", linestyle="--", label=f"p99 {p99:.1f} ms")
        ax.legend()
    ax.set(title=title, xlabel="latency (ms)", ylabel="frames")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def histogram_png(values: Sequence[float], stage: str, size: tuple[int, int] = (800, 480)) -> bytes:
    """The histogram as PNG bytes: drawn with matplotlib when it is importable, else with PIL."""
    w, h = size
    if w < 200 or h < 150:
        raise ValueError(f'Argument "size" must be at least (200, 150) pixels, got {size!r}.')
    try:
        import matplotlib  # noqa: F401  (optional; not a medrt dependency)
    except ImportError:
        return histogram_pil(values, stage, size)
    return histogram_matplotlib(values, stage, size)


def _bins(n: int) -> int:
    return int(min(40, max(5, math.sqrt(n))))


def histogram_pil(values: Sequence[float], stage: str, size: tuple[int, int]) -> bytes:
    """The same chart drawn with PIL: bars, axes with ms ticks, p50/p99 lines, labels."""
    from PIL import Image, ImageDraw, ImageFont

    w, h = size
    try:
        font: Any = ImageFont.load_default(size=max(10, h // 36))
    except (TypeError, ImportError, OSError):  # old Pillow or no FreeType: the bitmap font
        font = ImageFont.load_default()
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    left, right, top, bottom = 64, w - 20, 36, h - 52
    title, p50, p99 = _histogram_title(values, stage)
    d.text((w / 2, 8), title, fill="black", font=font, anchor="ma")
    d.text(((left + right) / 2, h - 8), "latency (ms)", fill="black", font=font, anchor="md")
    d.text((8, top - 6), "frames", fill="black", font=font, anchor="ld")
    d.line([(left, top), (left, bottom), (right, bottom)], fill="black", width=1)
    if not values:
        return _png(img)
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(np.asarray(values, np.float64), bins=_bins(len(values)), range=(lo, hi))
    ymax = max(1, int(counts.max()))

    def x_of(ms: float) -> float:
        return left + (ms - lo) / (hi - lo) * (right - left)

    def y_of(count: float) -> float:
        return bottom - count / ymax * (bottom - top - 16)

    for c, e0, e1 in zip(counts, edges[:-1], edges[1:], strict=True):
        if c:
            d.rectangle([x_of(e0) + 1, y_of(c), max(x_of(e0) + 1, x_of(e1) - 1), bottom - 1], fill="#4c72b0")
    for tick in np.linspace(lo, hi, 6):
        x = x_of(float(tick))
        d.line([(x, bottom), (x, bottom + 4)], fill="black")
        d.text((x, bottom + 6), f"{tick:.3g}", fill="black", font=font, anchor="ma")
    for tick in sorted({round(v) for v in np.linspace(0, ymax, 5)}):
        y = y_of(tick)
        d.line([(left - 4, y), (left, y)], fill="black")
        d.text((left - 6, y), str(tick), fill="black", font=font, anchor="rm")
    for name, ms, colour in (("p50", p50, "#2a9d3f"), ("p99", p99, "#d62728")):
        x = x_of(ms)
        for y0 in range(top, bottom, 8):  # dashed
            d.line([(x, y0), (x, min(y0 + 4, bottom))], fill=colour, width=2)
        near_right = x > right - 90
        d.text((x - 3 if near_right else x + 3, top + (0 if name == "p50" else 14)), f"{name} {ms:.1f}",
               fill=colour, font=font, anchor="ra" if near_right else "la")
    return _png(img)


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
