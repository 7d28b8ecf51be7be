"""The run report: ``report.json`` for programs, ``report.md`` for people, ``latency.png``."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from medrt import __version__
from medrt.engine.hardware import cpu_name, int8_kernels
from medrt.export.write import atomic_write

__all__ = ["write_report", "series_lesions", "series_problems", "acquisitions_text", "SIZE_BUCKETS"]

SIZE_BUCKETS = ((0.0, 2.0, "<2 mm"), (2.0, 5.0, "2-5 mm"), (5.0, 10.0, "5-10 mm"), (10.0, 30.0, "10-30 mm"),
                (30.0, float("inf"), ">=30 mm"))
STEPS = ("decode", "preprocess", "roi", "segment", "recheck", "postprocess", "total")


def diameters_text(f: dict[str, Any], most: int) -> str:
    """A series' largest lesion diameters for a table: "11.6, 4.2 mm", or each with its unit
    where they differ ("13.5 px, 11.4 mm"); "" for none. "…" where there are more."""
    sizes = f.get("diameters") or [[d, f.get("diameter_unit", "mm")] for d in f["diameters_mm"]]
    if not sizes:
        return ""
    more = " …" if len(sizes) > most else ""
    if len({u for _, u in sizes}) == 1:
        return ", ".join(f"{d:.1f}" for d, _ in sizes[:most]) + f"{more} {sizes[0][1]}"
    return ", ".join(f"{d:.1f} {u}" for d, u in sizes[:most]) + more


def _buckets(findings: list[dict[str, Any]]) -> dict[str, int]:
    """Lesions by longest diameter in mm; a lesion measured in pixels (no spacing in its
    frame's header) is left out, as its number is not millimetres."""
    counts = {name: 0 for _, _, name in SIZE_BUCKETS}
    for f in findings:
        sizes = f.get("diameters") or [[d, f.get("diameter_unit", "mm")] for d in f["diameters_mm"]]
        for d, unit in sizes:
            if unit == "px":
                continue
            for lo, hi, name in SIZE_BUCKETS:
                if lo <= d < hi:
                    counts[name] += 1
                    break
    return counts


def series_lesions(f: dict[str, Any], key: str = "lesions") -> str:
    """A series' lesion (or section) count for a table: "-" when none of its images was
    analysed (it is not a negative series)."""
    return "-" if not f["frames"] and f.get("failed") else str(f[key])


def acquisitions_text(f: dict[str, Any]) -> str:
    """"2 acquisitions (lesions 3 + 3)" for a series of several whole acquisitions at the
    same slice positions (each analysed as a stack of its own; a lesion seen in both passes
    is in each count), else ""."""
    n = f.get("acquisitions") or 1
    if n < 2:
        return ""
    per = f.get("lesions_by_acquisition") or {}
    counts = f" (lesions {' + '.join(str(v) for v in per.values())})" if per else ""
    return f"{n} acquisitions{counts}"


def series_problems(f: dict[str, Any]) -> str:
    """What a table row must say beside a series' findings: images that could not be
    analysed and outputs that could not be written (errors.csv has each reason)."""
    parts = []
    if f.get("failed"):
        n = f["failed"]
        parts.append(f"not analysed: {n} image(s) failed" if not f["frames"] else f"{n} image(s) not analysed")
    parts += [f"{what.upper() if what in ('seg', 'sr', 'sc') else what} not written" for what in f.get("not_written", ())]
    if f.get("seg_left_out"):
        parts.append(f"{f['seg_left_out']} image(s) with lesions not in the SEG")
    return "; ".join(parts) + " (errors.csv)" if parts else ""


def write_report(s: Any, plan: Any, settings: dict[str, Any], analyzer: Any, telemetry: Any,
                 out: Path, *, engine: dict[str, Any] | None = None, timings: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write report.json and report.md. ``engine`` (backend, precision, models, processor)
    and ``timings`` stand in for ``analyzer`` and ``telemetry`` when the frames were analysed
    elsewhere (medrt.distributed: throughput is then frames over the run's wall time);
    ``extra`` adds top-level sections (``cluster``)."""
    fps = None
    if timings is not None:
        timings = dict(timings)
        fps = s.frames / s.elapsed_s if s.frames and s.elapsed_s > 0 else None
    else:
        timings = {}
    if telemetry is not None and telemetry.frames:
        summary = telemetry.summary()
        timings = {k: v for k, v in summary["timings_ms"].items() if k in STEPS}
        timings["end_to_end"] = summary["e2e_ms"]
        fps = summary["fps"]
        if telemetry.frames > telemetry.warmup:
            telemetry.histogram_png(out / "latency.png")
    report = {
        "medrt": __version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(s.elapsed_s, 2),
        "interrupted": s.interrupted,
        "exit_code": s.exit_code,
        # the signal ("SIGTERM") that came while this report was written: every series is
        # finished (interrupted stays false), and the process exits 130, as exit_code says
        "stopped_while_writing": getattr(s, "stopped_while_writing", None),
        "input": str(plan.root),
        "counts": {
            "files_seen": s.files_seen, "series": s.series, "series_resumed": s.series_resumed,
            "series_analysed": s.series_analysed, "frames": s.frames,
            "frames_with_lesions": s.frames_with_lesions, "lesions": s.series_lesions, "lesion_sections": s.lesions,
            "errors": s.errors, "skipped": s.skipped,
        },
        "lesions_by_diameter": _buckets(s.findings),
        "series": s.findings,
        "timings_ms": timings,
        "throughput_fps": fps,
        "engine": ({**engine, "machine": platform.machine()} if engine is not None else
                   {"backend": analyzer.backend_name, "precision": analyzer.precision,
                    "models": list(analyzer.models), "machine": platform.machine(),
                    "processor": cpu_name(), "int8_kernels": int8_kernels()}),
        "settings": settings,
        **(extra or {}),
        "files": {"results": "results.jsonl", "lesions": "lesions.csv", "errors": "errors.csv", "masks": "masks.npz",
                  "histogram": "latency.png" if (out / "latency.png").exists() else None},
    }
    atomic_write(out / "report.json", lambda fp: fp.write(json.dumps(report, indent=2, default=str).encode()))
    atomic_write(out / "report.md", lambda fp: fp.write(_markdown(report).encode("utf-8", "backslashreplace")))
    return report


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}"


def _markdown(r: dict[str, Any]) -> str:
    c = r["counts"]
    e = r["engine"]
    lines = [
        "# medrt batch report",
        "",
        "Research use only; not for clinical use. Models trained on synthetic phantoms.",
        "",
        f"- input: `{r['input']}`",
        f"- finished: {r['finished_at']} in {r['elapsed_s']} s"
        + (" (**interrupted**: rerun to finish)" if r["interrupted"] else "")
        + (f" (**{r['stopped_while_writing']}** while this report was written: it is complete, and the run "
           f"exited {r['exit_code']})" if r.get("stopped_while_writing") else ""),
        f"- engine: {e['backend']} {e['precision']}; models {', '.join(e['models'])}",
        f"- series: {c['series']} ({c['series_resumed']} finished by an earlier run, {c['series_analysed']} now)",
        f"- frames: {c['frames']}, with lesions: {c['frames_with_lesions']}; lesions: {c['lesions']}, each counted "
        f"once ({c['lesion_sections']} sections: a CT lesion shows on each slice it crosses; lesions.csv lists them)",
        f"- errors: {c['errors']}, skipped: {c['skipped']} (see errors.csv)",
        "",
        "## Lesions by longest diameter",
        "",
        "| " + " | ".join(r["lesions_by_diameter"]) + " |",
        "|" + "---|" * len(r["lesions_by_diameter"]),
        "| " + " | ".join(str(v) for v in r["lesions_by_diameter"].values()) + " |",
        "",
        "## Series",
        "",
        "| series | modality | frames | lesions | sections | largest | notes | first file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in r["series"]:
        largest = diameters_text(f, 5) or "-"
        said = "; ".join(x for x in (acquisitions_text(f), series_problems(f), *f.get("seg_notes", ())) if x)
        lines.append(f"| `{f['series_instance_uid']}` | {f['modality']} | {f['frames']} | {series_lesions(f)} | "
                     f"{series_lesions(f, 'sections')} | {largest} | {said or '-'} | "
                     f"{f.get('first_file') or '-'} |")
    if r["timings_ms"]:
        lines += ["", "## Timings (this run, ms per frame, after warm-up)", "",
                  "| step | n | p50 | p95 | p99 |", "|---|---|---|---|---|"]
        for k, v in r["timings_ms"].items():
            lines.append(f"| {k} | {v['n']} | {_ms(v['p50'])} | {_ms(v['p95'])} | {_ms(v['p99'])} |")
        if r["throughput_fps"]:
            lines += ["", f"Throughput: {r['throughput_fps']:.1f} frames/s."]
        if r["files"]["histogram"]:
            what = "analysis time per frame on the Ray workers" if "cluster" in r else "end-to-end latency"
            lines += ["", f"![{what}](latency.png)"]
    if "cluster" in r:
        cl = r["cluster"]
        lines += ["", f"## Ray cluster ({cl['address']})", "",
                  f"{len(cl['workers'])} worker(s); {cl['workers_lost']} lost, "
                  f"{cl['series_sent_again']} series sent again.", "",
                  "| host | node | CPUs | series | frames | series s (summed; they overlap) | lost |",
                  "|---|---|---|---|---|---|---|"]
        for w in cl["workers"]:
            lines.append(f"| {w['host']} | `{(w['node_id'] or '')[:12]}` | {w['cpus']} | {w['series']} | "
                         f"{w['frames']} | {w['series_s']} | {'yes' if w['lost'] else ''} |")
    return "\n".join(lines) + "\n"
