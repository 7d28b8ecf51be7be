"""``medrt batch INPUT --out OUT``: every DICOM image under INPUT, analysed, with outputs a PACS
and scripts can read. Exit codes: 0 all analysed, 1 completed with errors (see errors.csv),
2 failed (nothing analysed), 130 interrupted by Ctrl-C or SIGTERM (rerun to finish; finished series
are kept, and one that lands while the results and report are written waits until they are)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from medrt.batch.report import acquisitions_text, diameters_text, series_lesions, series_problems
from medrt.commands.options import (
    add_engine_options,
    add_pipeline_options,
    add_seg_options,
    analyzer_config,
    sigterm_as_interrupt,
    thread_layout,
)


def _progress(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.quiet or args.json:
        return None, None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]medrt batch"), BarColumn(), MofNCompleteColumn(), TextColumn("frames"),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
        console=Console(stderr=True), transient=False,
    )
    task = progress.add_task("frames", total=None, rate="")

    def update(done: int, total: int) -> None:
        speed = progress.tasks[0].speed
        progress.update(task, completed=done, total=total, rate=f"{speed:.1f}/s" if speed else "")

    return progress, update


def _table(summary: Any) -> str:
    """One line per series: its UID whole (two UIDs often differ only in their last
    digits), modality, frames, lesions, the largest diameters, and its first file."""
    width = max([len("series")] + [len(f["series_instance_uid"]) for f in summary.findings])
    lines = [f"{'series':<{width}} {'mod':<4} {'frames':>6} {'lesions':>7}  largest diameters  [first file]"]
    for f in summary.findings:
        sizes = diameters_text(f, 6)
        said = " · ".join(x for x in (sizes, acquisitions_text(f), series_problems(f)) if x)
        first = f"  [{printable(f['first_file'])}]" if f.get("first_file") else ""
        lines.append(f"{f['series_instance_uid']:<{width}} {f['modality']:<4} {f['frames']:>6} "
                     f"{series_lesions(f):>7}  {said or '-'}{first}")
    return "\n".join(lines)


def _summary_line(summary: Any, out: Path) -> str:
    """The closing line: lesions each counted once, and beside them the sections, one per
    image a lesion is on. The sections are every series' (a radiograph's nodule is one),
    so they are not called CT's: with radiographs in the run that said "24 sections on CT
    slices" where the CT slices held 17."""
    c = summary.report["counts"]
    sections = (f" ({c['lesion_sections']} sections: a CT lesion once per slice it is on)"
                if c["lesion_sections"] != c["lesions"] else "")
    finished = c["series_resumed"] + c["series_analysed"]
    series = (f"{c['series']} series ({c['series_resumed']} already done)" if finished >= c["series"]
              else f"{finished} of {c['series']} series finished ({c['series_resumed']} already done)")
    return (f"{c['lesions']} lesion(s){sections} in {c['frames_with_lesions']} of {c['frames']} frame(s), {series}; "
            f"{c['errors']} error(s), {c['skipped']} skipped "
            f"-> {out / 'results.jsonl'}, {out / 'lesions.csv'}, report {out / 'report.md'}"
            + (f", see {out / 'errors.csv'}" if c["errors"] or c["skipped"] else ""))


def printable(name: str) -> str:
    """A file name as the terminal can show it: bytes that are not UTF-8 (a Latin-1 name
    from another hospital's disc) as \\xNN escapes."""
    import os

    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _on_ray(args: argparse.Namespace, config: Any, update: Any) -> Any:
    """The batch through Ray workers (medrt.distributed); None after printing why it cannot run."""
    from medrt.distributed import ClusterError, RayOptions, ray_available, run_distributed

    if not ray_available():
        print("medrt batch: --ray needs Ray on this machine and every node: pip install 'medrt[ray]'",
              file=sys.stderr)
        return None
    options = RayOptions(address=args.ray, actors=args.ray_workers, cpus_per_actor=args.ray_cpus,
                         gpus_per_actor=args.ray_gpus, workers=args.workers)
    try:
        return run_distributed(config, options, progress=update)
    except ClusterError as exc:
        print(f"medrt batch: {exc}", file=sys.stderr)
        return None


def _unwritable(out: Path) -> str:
    """Why ``out`` cannot take the outputs ("" when it can): made if missing, then a file
    written and removed in it."""
    import os
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".medrt-probe-", suffix=".tmp", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def run(args: argparse.Namespace) -> int:
    from medrt.analyzer import load_analyzer
    from medrt.batch import EXIT_FAILED, BatchConfig, OutputOptions, run_batch

    if not Path(args.input).exists():
        print(f"medrt batch: {args.input}: no such file or folder", file=sys.stderr)
        return 2
    if args.ray is not None and not args.ray.strip():  # an unset $RAY_ADDRESS: not a local run in disguise
        print("medrt batch: --ray needs an address: 'local', 'auto', HOST:PORT or ray://HOST:PORT", file=sys.stderr)
        return 2
    if args.ray and (args.processes or args.decode_processes):
        print("medrt batch: --processes and --decode-processes are for a local run, not with --ray "
              "(each Ray worker is a process of its own; --ray-workers sets how many)", file=sys.stderr)
        return 2
    if args.ray_workers is not None and args.ray_workers < 1:
        print("medrt batch: --ray-workers takes a count >= 1", file=sys.stderr)
        return 2
    _, workers = thread_layout(args)
    config = BatchConfig(
        input=Path(args.input), out=Path(args.out), analyzer=analyzer_config(args), workers=workers,
        decode_workers=args.decode_workers, decode_processes=args.decode_processes,
        processes=args.processes, depth=args.depth,
        outputs=OutputOptions(png=args.png, png_max_side=args.png_max_side or None, sc=args.sc,
                              omit_empty_frames=args.omit_empty_frames, seg_compression=args.seg_compression),
        follow_links=args.follow_links,
    )
    if args.ray:  # each worker sizes its sessions from its own CPUs unless --threads says
        config = replace(config, analyzer=replace(config.analyzer, threads=args.threads))
    problem = _unwritable(config.out)
    if problem:  # before the models load: a wrong --out should not cost a minute and a traceback
        print(f"medrt batch: cannot write to {config.out}: {problem}", file=sys.stderr)
        return 2
    analyzer = None if args.ray else load_analyzer(config.analyzer)
    progress, update = _progress(args)
    if progress is not None:
        progress.start()
    try:
        with sigterm_as_interrupt():
            summary = (_on_ray(args, config, update) if args.ray
                       else run_batch(config, analyzer=analyzer, progress=update))
    finally:
        if progress is not None:
            progress.stop()
    if summary is None:
        return 2
    out = Path(args.out)
    if args.json:
        print(json.dumps(summary.report, indent=2, default=str))
        return summary.exit_code
    if not args.quiet:
        print(_table(summary))
        print()
    print(_summary_line(summary, out))
    if summary.interrupted:
        print("medrt batch: interrupted; run the same command again to finish", file=sys.stderr)
    elif summary.stopped_while_writing:
        print(f"medrt batch: {summary.stopped_while_writing} while the results and report were written; "
              "they were finished first and are complete", file=sys.stderr)
    elif summary.exit_code == EXIT_FAILED:
        print(f"medrt batch: nothing analysed in {args.input}: {_why_nothing(summary.report['counts'], out / 'errors.csv')}", file=sys.stderr)
    return summary.exit_code


def _why_nothing(counts: dict[str, int], errors_csv: Path) -> str:
    """Why a run analysed no frame: files that could not be read come first (a folder of
    CT slices without Series UIDs is not "no image these models are for")."""
    if counts["errors"]:
        more = f" and {counts['skipped']} passed over" if counts["skipped"] else ""
        return f"{counts['errors']} file(s) could not be read{more}, see {errors_csv}"
    if counts["skipped"]:
        return f"no DICOM image that these models are for ({counts['skipped']} file(s) passed over, see {errors_csv})"
    return "no DICOM image that these models are for"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "batch",
        help="analyse a folder: SEG/SR/PNG per series, results.jsonl, errors.csv, report",
        description=__doc__,
    )
    p.add_argument("input", help="folder (searched recursively), file, or a disc's DICOMDIR")
    p.add_argument("--out", required=True, help="output folder (created; a rerun resumes)")
    p.add_argument("--png", default="positive", choices=("positive", "all", "none"),
                   help="overlay PNGs for frames with lesions (default), every frame, or none")
    p.add_argument("--png-max-side", type=int, default=2048, help="downsample PNGs to this longest side (default 2048; 0: full size)")
    p.add_argument("--sc", action="store_true", help="also write secondary captures with the overlay burned in")
    add_seg_options(p)
    p.add_argument("--follow-links", action="store_true", help="follow symbolic links that lead outside INPUT")
    p.add_argument("--json", action="store_true", help="print the run report as JSON (no progress bar)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar, table or warnings (errors.csv lists every file passed over, and why); "
                        "errors and the summary line still print")
    add_engine_options(p)
    add_pipeline_options(p, policy=None)
    g = p.add_argument_group("past one machine (Ray; the ray extra on every node)")
    g.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="analyse the series on a Ray cluster: 'auto' (the cluster `ray start` made on this "
                        "machine), HOST:PORT (a cluster's head), ray://HOST:10001 (Ray Client), or 'local' (a "
                        "private cluster on this machine for this run). Series travel to the workers through "
                        "Ray's object store: no shared folder is needed; outputs are written here as in a "
                        "local run")
    g.add_argument("--ray-workers", type=int, default=None, metavar="N",
                   help="Ray workers (each loads the models once); default: one per node with all its CPUs, "
                        "or one per GPU with a GPU backend")
    g.add_argument("--ray-cpus", type=float, default=None, metavar="N",
                   help="CPUs each Ray worker reserves (default: the node's CPUs; 1 with --ray-workers)")
    g.add_argument("--ray-gpus", type=float, default=None, metavar="N",
                   help="GPUs each Ray worker reserves (default: 1 with a GPU backend, else 0)")
    p.set_defaults(func=run)
