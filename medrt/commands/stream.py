"""``medrt stream SOURCE``: the live pipeline, headless, with a status line and a summary."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from medrt.commands.options import (
    DEFAULT_LOOKAHEAD_S,
    LOOKAHEAD_MISUSE,
    add_engine_options,
    add_pipeline_options,
    analyzer_config,
    lookahead_misused,
    thread_layout,
    watch_lookahead,
)
from medrt.errors import NoModelForImageError, NotAnImageError

log = logging.getLogger(__name__)


class _Findings:
    """Counts what the stream found (a sink: runs on the pipeline's sink thread).

    ``loop_length``: a replay that sends its files again (``--loop``) sends this many per
    loop; the lesion count starts afresh with each loop's first result, so no lesion of
    one loop is linked to the next's (a loop's last slice and the next loop's first may
    lie within a slice step's reach). The counts add up over the loops, as the frames do.
    """

    def __init__(self, loop_length: int | None = None) -> None:
        from medrt.analysis.tracking import LesionCounter

        self.loop_length = loop_length
        self.loop = 0  # the loop of the last result
        self.frames = 0
        self.positive = 0
        self.counter = LesionCounter()  # each lesion once: its sections on the slices before joined
        self.errors: list[tuple[str, str, str]] = []  # key, reason, the file it came from
        self.recovered = 0  # files that failed, changed, then were read (a watched file written slowly)
        self.skipped = 0  # not DICOM
        self.not_images = 0  # DICOM objects that hold no image (SR, SEG, KO, DICOMDIR...)
        self.no_model: list[tuple[str, str]] = []  # frames of a modality no loaded model is for

    def on_result(self, result: Any, env: Any) -> None:
        origin = str(getattr(env, "origin", "") or "")
        if origin and any(o == origin for *_, o in self.errors):
            # a watched file read while its sender stalled, read again once complete:
            # the image was not lost, so its first failure is no longer an error
            self.errors = [e for e in self.errors if e[2] != origin]
            self.recovered += 1
        if self.loop_length:
            loop = env.seq // self.loop_length  # (a frame dropped at the entry still took its place)
            if loop != self.loop:
                self.counter.restart()
                self.loop = loop
        self.frames += 1
        self.positive += bool(result.lesions)
        self.counter.add(result)

    def on_error(self, error: Any, env: Any) -> None:
        if isinstance(error.error, NoModelForImageError):
            self.no_model.append((str(getattr(env, "origin", "") or error.key), error.error.reason))
        elif isinstance(error.error, NotAnImageError):
            self.not_images += 1
        elif error.skippable:
            self.skipped += 1
        else:
            self.errors.append((error.key, error.reason, str(getattr(env, "origin", "") or error.key)))


def _source(args: argparse.Namespace) -> Any:
    from medrt.io.sources import FileReplay, FolderWatch

    src = Path(args.source)
    if lookahead_misused(args):
        raise ValueError(f"{LOOKAHEAD_MISUSE} (a replay knows its file order)")
    if args.watch:
        return watch_lookahead(FolderWatch(src, idle_timeout=args.idle_exit), args.lookahead)
    return FileReplay.from_path(src, fps=args.fps, loop=args.loop)


def run(args: argparse.Namespace) -> int:
    from medrt.analyzer import load_analyzer
    from medrt.io.sources import FileReplay, Lookahead
    from medrt.pipeline.admission import live_in_flight
    from medrt.pipeline.graph import Pipeline
    from medrt.pipeline.stages import analysis_stages

    try:
        source = _source(args)
    except (OSError, ValueError) as exc:
        print(f"medrt stream: {exc}", file=sys.stderr)
        return 2
    analyzer = load_analyzer(analyzer_config(args))
    _, workers = thread_layout(args)
    looped = isinstance(source, FileReplay) and source.loop > 1
    findings = _Findings(len(source.paths) if looped else None)
    # a replay's files in slice order, each pass of a series of several acquisitions ended:
    # a 2.5-D model's neighbours (read from the headers; a 2-D model needs none)
    order = source.slice_order() if isinstance(source, FileReplay) and analyzer.slices > 1 else None
    stages = analysis_stages(analyzer, infer_workers=workers, decode_workers=args.decode_workers,
                             decode_processes=args.decode_processes, processes=args.processes, order=order,
                             ahead=source if isinstance(source, Lookahead) else None)  # --lookahead
    # Drop (or refuse) at the entry only, before any work is spent on a frame; the
    # inner edges block, so back-pressure reaches the entry. A live replay keeps up
    # with its "scanner" (latest); a watched folder or an as-fast-as-it-goes replay
    # is a pull from files that wait on disk, so by default nothing is dropped.
    if args.policy is not None:
        entry = args.policy
    else:
        entry = "block" if args.watch or args.fps == 0 else "latest"
    policy: Any = {stages[0].name: entry}
    # A live replay that falls behind keeps its backlog at the entry, where latest-wins
    # drops it, not in the inner queues (each frame there would reach the sink late).
    bound = live_in_flight(entry, stages, args.max_in_flight)
    pipe = Pipeline(source, stages, [findings], policy=policy, depth=args.depth, telemetry=True, name="stream",
                    max_in_flight=bound)
    tel = pipe.telemetry
    live = not args.quiet and not args.json
    tty = sys.stderr.isatty()
    interrupted = False
    from medrt.commands.options import sigterm_as_interrupt

    pipe.start()
    try:
        # systemd, `timeout`, a scheduler: SIGTERM stops as Ctrl-C does, summary and all
        with sigterm_as_interrupt():
            last_print = 0.0
            while not pipe.join(0.25):
                tel.sample_memory()
                now = time.monotonic()
                if live and (tty or now - last_print >= 5.0):
                    line = tel.status_line()
                    print(f"\r{line}\033[K" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
                    last_print = now
    except KeyboardInterrupt:
        interrupted = True
        print("\nmedrt stream: stopping (Ctrl-C again to abort)", file=sys.stderr)
        pipe.stop(timeout=10.0)
    if live and tty:
        print(file=sys.stderr)
    summary = tel.summary()
    summary["pipeline"] = {"policy": entry, "depth": pipe.depth, "workers": workers, "max_in_flight": bound,
                           "edges": pipe.counters(), "sink_errors": pipe.sink_errors}
    summary["findings"] = {"frames": findings.frames, "positive_frames": findings.positive,
                           "lesions": findings.counter.lesions, "lesion_sections": findings.counter.sections,
                           "errors": len(findings.errors), "recovered_after_rewrite": findings.recovered,
                           "error_details": [{"file": o, "key": k, "reason": r} for k, r, o in findings.errors],
                           "skipped_not_dicom": findings.skipped, "skipped_not_an_image": findings.not_images,
                           "skipped_no_model": len(findings.no_model),
                           "loops": source.loop if isinstance(source, FileReplay) else 1}
    summary["engine"] = {"backend": analyzer.backend_name, "precision": analyzer.precision,
                         "models": list(analyzer.models)}
    late = getattr(source, "late", None)
    if late is not None:
        summary["pipeline"]["late_source_items"] = late
    if args.jsonl:
        tel.write_jsonl(args.jsonl)
    if args.histogram:
        tel.histogram_png(args.histogram)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(tel.summary_table())
        f = summary["findings"]
        sections = f" ({f['lesion_sections']} sections)" if f["lesion_sections"] != f["lesions"] else ""
        loops = f" over {f['loops']} loops, each counted afresh" if f["loops"] > 1 else ""
        print(f"findings: {f['lesions']} lesion(s){sections} in {f['positive_frames']} of {f['frames']} frame(s)"
              f"{loops}; "
              f"{f['errors']} unreadable input(s), {f['skipped_not_dicom']} non-DICOM file(s) skipped"
              + (f", {f['skipped_not_an_image']} DICOM object(s) that are not images" if f["skipped_not_an_image"]
                 else "")
              + (f", {f['skipped_no_model']} frame(s) no model is for" if f["skipped_no_model"] else "")
              + f"; backend {analyzer.backend_name} {analyzer.precision}; "
              f"queue depth {pipe.depth}, {workers} inference worker(s)")
        if findings.recovered:
            print(f"  {findings.recovered} file(s) changed after a failed read and were read again")
        for key, reason, _ in findings.errors[:20]:  # medrt's own reasons name the file already
            print(f"  error: {reason if key in reason else f'{key}: {reason}'}")
        if findings.no_model:  # one line: they share the reason, modality apart
            key, reason = findings.no_model[0]
            print(f"  skipped: {key}: {reason}" + (f" (and {len(findings.no_model) - 1} more)"
                                                   if len(findings.no_model) > 1 else ""))
    if interrupted:
        return 130
    return 1 if findings.errors else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "stream",
        help="run the live pipeline on a replayed or watched source, headless",
        description="Replay a folder (or file) at --fps the way a scanner sends images, or watch a folder for "
        "new files, through the staged pipeline. Prints a status line (fps, p99 latency, drops) while it runs and "
        "a summary at the end. Exit code 0: all frames analysed; 1: some inputs could not be read; 2: bad usage.",
    )
    p.add_argument("source", help="folder, file or DICOMDIR to replay (or the folder to watch with --watch)")
    p.add_argument("--fps", type=float, default=30.0, help="replay rate, frames per second (0: as fast as possible)")
    p.add_argument("--loop", type=int, default=1, help="replay the source this many times (soak runs)")
    p.add_argument("--watch", action="store_true", help="watch SOURCE for new complete files instead of replaying")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="with --watch, stop after this long without a new file (default: run until Ctrl-C)")
    p.add_argument("--lookahead", type=float, default=None, metavar="SECONDS",
                   help="with --watch, hold each file until the next one arrives (at most SECONDS), so a 2.5-D "
                        "model gets the slice after it too, as in a replay or a batch (on a thin-slice series the "
                        "next few, up to the distance the model learnt: three at 1 mm for 3 mm); adds that many "
                        "frame intervals of latency, which the figures include (default: "
                        f"{DEFAULT_LOOKAHEAD_S:g} s when the model is 2.5-D, else none; 0: off)")
    p.add_argument("--jsonl", type=Path, default=None, help="write per-frame telemetry as JSON lines here")
    p.add_argument("--histogram", type=Path, default=None, help="write the end-to-end latency histogram PNG here")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no status line and no warnings (errors still print)")
    add_engine_options(p)
    add_pipeline_options(p, policy="latest (replay) / block (--watch, --fps 0)")
    p.set_defaults(func=run)
