"""What the viewer opens: files and folders, live streams (replay, folder watch), SEGs,
and the handlers for what the pipeline sends back. Mixed into the main window.

Every handler runs on the GUI thread (queued connections from the
:class:`~medrt_gui.bridge.Bridge`), only updates the :class:`Study` and asks
for a render, so it costs microseconds whatever the frame size. Anything from
a session that was stopped is ignored, by session id.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from medrt_gui.bridge import Arrival, DecodedFile, Failure, Ready, Session
from medrt_gui.seg import read_seg, segments_on
from medrt_gui.study import Study

__all__ = ["StreamsMixin"]

log = logging.getLogger(__name__)


class StreamsMixin:
    """Opening and streaming for :class:`medrt_gui.window.MainWindow` (uses its attributes)."""

    # -- opening -----------------------------------------------------------------------

    def open_path(self: Any, path: str | os.PathLike[str], *, analyse: bool | None = None) -> Study:
        """Open a file or folder: series in slice order, SEGs found beside them laid over their
        images, and (unless ``analysis`` is off) the AI run over every image in the background."""
        self.stop_sessions()
        path = Path(path)
        if not path.exists():
            self.status(f"{path}: no such file or folder")
            return self.study
        study = Study.from_paths([path], title=f"Opened {path}")
        self._set_study(study)
        for problem in study.problems:
            if not problem.skipped:
                self._note_failure(problem)
        bad = [p for p in study.problems if not p.skipped]
        if not study.series:
            self.status(f"{path}: no DICOM image found" + (f"; {bad[0]}" if bad else ""))
        elif bad:
            self.status(f"{len(bad)} file(s) could not be read; first: {bad[0]}", 30_000)
        else:
            self.status(f"opened {study.frames} image(s) in {len(study.series)} series")
        for seg in study.seg_paths:
            self.open_seg(seg)
        if study.series and (self.analysis_enabled if analyse is None else analyse):
            from medrt.io.sources import FileReplay

            # the neighbours from the slice order, each pass of a series of several acquisitions ended
            self._start_session("analysis", FileReplay(study.files(), fps=0, order=study.slice_order),
                                label=path.name)
        return study

    def start_replay(self: Any, folder: str | os.PathLike[str], fps: float = 30.0, loop: int = 1) -> Session | None:
        """Replay ``folder`` as a stream at ``fps`` (a scanner sending images), ``loop`` times."""
        from medrt.io.sources import FileReplay

        self.stop_sessions()
        try:
            source = FileReplay.from_path(folder, fps=fps, loop=loop)
        except (OSError, ValueError) as exc:
            self.status(f"cannot replay {folder}: {exc}")
            return None
        self._set_study(Study(title=f"Replay of {folder} at {fps:g} fps", live=True))
        return self._start_session("replay", source, label=f"{fps:g} fps")

    def start_watch(self: Any, folder: str | os.PathLike[str], *, existing: bool = True,
                    lookahead: float | None = None) -> Session | None:
        """Show images as they land in ``folder`` (a PACS listener's spool, a scanner export).
        ``lookahead`` > 0: hold each until the next lands (at most that many seconds), so a
        2.5-D model gets the slice after it too (:class:`medrt.io.sources.Lookahead`; on a
        thin-slice series the next few, up to the distance the model learnt); None: that,
        up to half a second, when the model is 2.5-D; 0: never
        (:func:`medrt.commands.options.watch_lookahead`)."""
        from medrt.commands.options import watch_lookahead
        from medrt.io.sources import FolderWatch

        self.stop_sessions()
        try:
            source: Any = watch_lookahead(FolderWatch(folder, existing=existing), lookahead)
        except OSError as exc:
            self.status(f"cannot watch {folder}: {exc}")
            return None
        self._set_study(Study(title=f"Watching {folder}", live=True))
        return self._start_session("watch", source, label=Path(folder).name)

    def _set_study(self: Any, study: Study) -> None:
        self.study = study
        self.series_i = self.slot_i = 0
        self.window_cw = None
        self.shown_key = self._finding = None
        self.newest_result_key = None
        self.frames_received = self.results_received = 0
        self.failures = []
        self.cine.stop()
        self.controls.follow.setChecked(True)
        self.view.fit()
        self.browser.show_study(study, 0, show_patient=self.show_patient)
        self.request_render()

    def _start_session(self: Any, kind: str, source: Any, label: str) -> Session:
        self._sid += 1
        self.session = Session(self._sid, kind, source, self.provider, self.bridge, label=label,
                               workers=self.workers).start()
        self.monitor.reset()
        return self.session

    def stop_stream(self: Any) -> None:
        if self.session is not None:
            self.session.stop()
            self.status("stream stopped")

    def stop_sessions(self: Any, wait: float = 0.0) -> None:
        if self.session is not None:
            self.session.stop(wait)

    # -- SEG ------------------------------------------------------------------------------

    def open_seg(self: Any, path: str | os.PathLike[str]) -> int:
        """Lay a DICOM SEG over the images it refers to; returns how many frames it matched."""
        try:
            seg = read_seg(path)
        except (ValueError, OSError) as exc:
            self.study.add_problem(str(path), str(exc), seg=True)
            self.status(str(exc))
            return 0
        matched = 0
        for key, labels in seg.masks.items():
            found = self.study.find(key)
            if found is not None:
                slot = found[2]
                slot.seg_labels, slot.seg_overlay, slot.seg = labels, None, seg
                slot.seg_present = segments_on(labels)
                slot.version += 1
                matched += 1
        if matched:
            named = ", ".join(seg.labels) if len(seg.labels) <= 3 else f"{len(seg.labels)} segments"
            self.status(f"SEG {seg.path.name}: {matched} frame(s) matched ({named})")
        else:
            self.status(f"SEG {seg.path.name}: refers to none of the open images; open its source first")
        self.request_render()
        return matched

    # -- from the pipeline (GUI thread) ----------------------------------------------

    def _mine(self: Any, sid: int) -> bool:
        return self.session is not None and sid == self.session.sid

    def _on_frame(self: Any, a: Arrival) -> None:
        if not self._mine(a.session):
            return
        shown = self.current_slot()
        si, idx = self.study.add_live_frame(a.frame, a.index, a.path, keep=self.live_keep)
        self.frames_received += 1
        gone = self.study.drop_problems(a.path) if a.path is not None and self.study.problems else []
        if gone:  # read half-written earlier (a stalled sender), whole now: no longer a problem
            said = {str(p) for p in gone}
            self.failures = [f for f in self.failures if f not in said]
            log.info("viewer: %s was read after all", a.path)
        # Following the AI's results: the images are shown as they land only until the
        # first result comes (the models' first frame), then each result brings its image.
        if self.controls.follow.isChecked() and not (self.following_results() and self.newest_result_key):
            self.follow_to(si, idx)
        else:
            self.keep_showing(shown)  # the image may have been placed before the one shown
            if si == self.series_i and idx == self.slot_i:
                self.request_render()

    def _on_result(self: Any, r: Ready) -> None:
        if not self._mine(r.session):
            return
        found = self.study.find(r.result.frame.key)
        if found is None:  # a live image already trimmed from the history
            return
        si, idx, slot = found
        slot.set_result(r.result, r.overlay, r.latency_ms, r.index)
        self.results_received += 1
        self.session.last_latency_ms = r.latency_ms
        self.newest_result_key = r.result.frame.key
        if self.following_results():  # results come in arrival order: this is the newest
            self.follow_to(si, idx)
        elif si == self.series_i and idx == self.slot_i:
            self.request_render()

    def _on_failure(self: Any, f: Failure) -> None:
        if not self._mine(f.session):
            return
        known = len(self.study.problems)
        problem = self.study.add_problem(f.name, f.reason, skipped=f.skippable)
        if f.skippable:
            if len(self.study.problems) > known:  # a note once, not on every replay loop
                self.status(f"skipped {problem}", 5000)
            return
        if self._note_failure(problem):
            log.warning("viewer: %s", problem)
        self.status(str(problem), 30_000)

    def _note_failure(self: Any, problem: Any) -> bool:
        """Keep a file's first problem in ``failures``, once: the same file fails both when
        the AI reads it and when it is decoded for display (the status bar counted it
        twice). Returns whether the file is new there."""
        if any(f.startswith(f"{problem.name}: ") for f in self.failures):
            return False
        self.failures.append(str(problem))
        return True

    def finished_message(self: Any) -> str:
        """What an opened folder's analysis found: lesions each counted once (a CT lesion's
        sections on neighbouring slices joined, as the Series tab and ``medrt batch`` count
        them), the sections when they are more, and the images with any."""
        frames = [s for e in self.study.series for s in e.slots if s.result is not None]
        sections = sum(len(s.result.lesions) for s in frames)
        lesions = sum(len(e.series_lesions()[0]) for e in self.study.series)
        positive = sum(1 for s in frames if s.result.lesions)
        bad = len(self.failures)  # files, each once
        found = f"{lesions} lesion(s)" + (f" ({sections} sections: a CT lesion once per slice it is on)" if sections != lesions else "")
        return (f"analysis finished: {found} in {positive} of {len(frames)} image(s)"
                + (f"; {bad} file(s) could not be read, first {self.failures[0]}" if bad else ""))

    def _on_session_started(self: Any, sid: int, backend: str) -> None:
        if self._mine(sid):
            self.status(f"{self.session.kind}: running on {backend}", 5000)

    def _on_session_ended(self: Any, sid: int) -> None:
        if not self._mine(sid):
            return
        if not self.session.live:
            self.status(self.finished_message(), 0)
        else:
            self.status(f"{self.session.kind} ended: {self.frames_received} image(s) received", 0)
        self._tick()
        self._update_hud()
        self.session_finished = sid
        self.sessionFinished.emit(sid)

    def _on_decoded(self: Any, d: DecodedFile) -> None:
        if d.reason is not None:
            for slot in self.study.slots_of(d.path):
                slot.error = d.reason
                slot.version += 1
            problem = self.study.add_problem(str(d.path), d.reason)
            self._note_failure(problem)
            self.status(str(problem), 30_000)
        for frame, index in d.frames:
            found = self.study.find(frame.key)
            if found is not None and found[2].frame is None:
                found[2].set_frame(frame, index)
        slot = self.current_slot()
        if slot is not None and slot.path == d.path:
            self.request_render()
