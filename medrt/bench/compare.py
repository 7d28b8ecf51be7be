"""Compare a ``medrt bench --json`` result with a saved baseline and list what got worse.

``medrt bench --compare baseline.json`` uses it to exit non-zero when a figure
moved the wrong way by more than the tolerance (a cuDNN or onnxruntime update
that slowed a stage, a change that made decode slower than pydicom).

Each number's direction comes from this table; a number not in it is not
compared (configuration, accuracy, informational):

==========================================  ===========  ==============================================
key                                         better       why
==========================================  ===========  ==============================================
``*_ms`` (``p50_ms``, ``roi_ms_p50``, …)     lower        a latency; ``*_ms_p50`` too
``p50`` / ``p95`` / ``p99``                 lower        latency percentiles (telemetry ``e2e_ms``)
``speedup`` (roi_vs_full, int8_vs_fp32)     higher       baseline time / medrt time
``fps``                                     higher       throughput
``efficiency``, ``achieved_gflops``         higher       UNet GFLOP/s, alone and against sgemm
``decode.rows[].ratio``                     lower        medrt_ms / pydicom_ms (not pydicom/medrt)
``cold_start.ratio``                        lower        first frame / steady state
``gate_passed``                             higher       INT8 accuracy gate: true must stay true
``drops``, ``errors``                       lower        frames lost (stream): see below
``late_source_items``                       lower        frames the replay sent late (stream): as drops
``analysed``                                higher       frames analysed (stream): see below
``*_mb`` (``memory_mb``, ``peak_mb``, …)     lower        memory, MB: see below
``rss_growth_pct``                          lower        RSS growth after warm-up (stream), %: see below
``pydicom_ms``, ``sgemm_gflops``            (ignored)    the reference measured beside us, not our code
``file_mb``                                 (ignored)    the decode suite's input file, not our code
other ``ratio`` keys                        (unknown)    reported as a note, never guessed
==========================================  ===========  ==============================================

Frames lost are counts, not timings, and a baseline of none is the usual case, so
they are not judged by relative change alone: a frame that failed (``errors``)
more than the baseline is a regression whatever the tolerance; a dropped frame, a
frame not analysed (``frames - analysed``), or one the replay sent later than its
period (``late_source_items``: the pipeline pushed back on a live source) is one
when the baseline had none, and otherwise when the count grew by more than the
tolerance.

Memory is judged by the tolerance too, but a resident set moves by pages, arenas and
the kernel's timing, so a small figure's relative change says little (on a 100-slice
series, ``series_outputs``' ``peak_rss_mb`` was 10.7, 0.9 and 10.7 MB in three runs,
its traced ``peak_mb`` 29.9 MB each time; the 320-frame stream's ``rss_growth_pct``
-1.95, -2.33 and -2.78 %, and +0.04 to +2.3 % in the README's runs). A megabyte figure
(an engine's ``memory_mb``, ``series_outputs``' ``peak_mb`` and ``peak_rss_mb``, a
telemetry summary's ``rss_*_mb`` and ``gpu_*_mb``) is a regression when it grew by
more than the tolerance *and* by more than :data:`MEMORY_FLOOR_MB`; the stream's
``rss_growth_pct``, already a share of the process's RSS, when it rose by more than
the tolerance of its value *and* by more than :data:`MEMORY_FLOOR_POINTS` points (+0.5 %
in the baseline and +1.9 % now is noise; +4 % is not). An improvement is the same the
other way.

A result that ran in the baseline and has an ``error`` now (an engine row whose
backend no longer loads) is a failure, listed as such, and :attr:`BenchDiff.ok` is
false: its figures are gone, not slower. An error row carries fewer identity keys
than the row it stands for (no ``size``), so it is matched to the other side's row
whose identity keys agree with all it has. One that failed in the baseline and runs
now is a note.

Lists of rows are matched by identity, not position: a row's identity is the
values of whichever of ``syntax``, ``backend``, ``device``, ``precision``,
``size``, ``shape``, ``node``, ``stage``, ``edge`` it has (engine rows by
backend/device/precision/size, decode rows by syntax). A key or row present on
one side only is a note, not a regression. A changed run setting (``size``,
``frames``, ``repeats``, ``model``, ``hardware``, ``target_fps``, ``series`` (the
listener's memory suite, ``--series``; ray's series count); ``folder``, the series the
pipeline suites replay (``--stream-folder``; None, or absent in a result saved before it
was reported, is the sample stream); ``profile_graph.rewritten``, whether
``--profile-layers`` profiled the rewritten graph the session runs (a profile saved
before it was reported was of the file's graph: its nodes are others); ``cores``, the
usable cores, as a core count changes what a pipelined/serial or cluster/local
ratio means; ``workers``, ``processes``, ``depth`` and ``max_in_flight``, the
pipeline's layout, which decide its throughput, latency and drops) makes the
figures beside it incomparable: it is listed first, as a mismatch, the figures are
still shown, and :attr:`BenchDiff.ok` is false, so that ``medrt bench --compare``
exits 1 rather than pass a run it could not compare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Regression", "BenchDiff", "compare", "diff_bench", "format_regressions", "load_bench_json",
           "direction", "MEMORY_FLOOR_MB", "MEMORY_FLOOR_POINTS"]

LOWER, HIGHER = "lower", "higher"
HIGHER_BETTER = frozenset({"speedup", "fps", "efficiency", "achieved_gflops", "gate_passed"})
PERCENTILES = frozenset({"p50", "p95", "p99"})
REFERENCE = frozenset({"pydicom_ms", "sgemm_gflops", "file_mb"})
RATIO_LOWER = frozenset({"decode.rows[].ratio", "cold_start.ratio"})  # generic paths, list keys as []
IDENTITY = ("syntax", "backend", "device", "precision", "size", "shape", "node", "stage", "edge")
SETTINGS = frozenset({"size", "frames", "repeats", "model", "hardware", "target_fps",
                      "cores", "workers", "processes", "depth", "max_in_flight", "series", "folder",
                      "rewritten"})
# Settings a result saved before they were reported lacks, and the value they had then:
# the pipeline suites replayed the sample stream (``folder`` None) until --stream-folder.
ABSENT_SETTINGS: dict[str, Any] = {"folder": None}
# The same for a setting beside a figure: a layer profile saved before ``profile_graph`` was
# reported beside ``profile_layers`` was of the model file's graph, not the rewritten one the
# session runs, so its nodes are not the nodes profiled now (``rewritten`` a setting).
ABSENT_BESIDE: dict[str, tuple[str, Any]] = {"profile_graph": ("profile_layers", {"rewritten": False})}
# Frames lost (or sent late), and the tolerance each gets on top of "none in the baseline,
# some now": a failed frame is never noise (0), a dropped or late one is timing (the
# tolerance, None).
LOST = {"errors": 0.0, "drops": None, "analysed": None, "late_source_items": None}
#: Memory: how much a figure in MB (``*_mb``) must grow, on top of the tolerance, to be a
#: regression, and how many points a growth in percent (``MEMORY_PCT``) must rise.
MEMORY_FLOOR_MB = 16.0
MEMORY_FLOOR_POINTS = 2.0
MEMORY_PCT = frozenset({"rss_growth_pct"})


@dataclass(frozen=True, slots=True)
class Regression:
    """A figure that moved the wrong way by more than the tolerance.

    ``change`` is ``(current - baseline) / baseline``, signed: +0.30 is a latency
    30 % higher, -0.20 a speed-up 20 % lower; ``inf`` for frames lost where the
    baseline lost none.
    """

    key: str
    baseline: float
    current: float
    change: float


@dataclass(frozen=True, slots=True)
class BenchDiff:
    """Everything a comparison found: regressions, notes, and how many figures were compared.

    ``mismatches``: run settings that differ between the two (``"stream_30fps.target_fps:
    30.0 in the baseline, 60.0 now"``), which make the figures beside them incomparable.
    ``failures``: results that ran in the baseline and have an ``error`` now."""

    regressions: tuple[Regression, ...]
    notes: tuple[str, ...] = ()
    checked: int = 0
    tolerance: float = 0.15
    improvements: tuple[Regression, ...] = ()
    mismatches: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No regression, no failure, and nothing compared across different settings."""
        return not self.regressions and not self.mismatches and not self.failures


def direction(path: str, key: str) -> str | None:
    """``"lower"`` or ``"higher"`` is better for ``key`` at ``path`` (list indices as ``[]``);
    ``None`` when it is not a compared figure, ``"unknown"`` for a ratio we cannot place."""
    if key in REFERENCE:
        return None
    if key in LOST:
        return HIGHER if key == "analysed" else LOWER
    if key == "ratio":
        return LOWER if path in RATIO_LOWER else "unknown"
    if key in HIGHER_BETTER:
        return HIGHER
    if _memory_unit(key):
        return LOWER
    if key in PERCENTILES or key.endswith("_ms") or "_ms_p" in key:
        return LOWER
    return None


def _memory_unit(key: str) -> str | None:
    """``"MB"`` or ``"points"`` for a memory figure (``MEMORY_FLOOR_MB``,
    ``MEMORY_FLOOR_POINTS``), None for any other key."""
    if key in MEMORY_PCT:
        return "points"
    if key.endswith("_mb") and key not in REFERENCE:
        return "MB"
    return None


def _setting(key: str, value: Any) -> str:
    """A run setting's value for a mismatch line (``folder`` None is the sample stream)."""
    return "the sample stream" if key == "folder" and value is None else repr(value)


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def _row_id(row: Mapping[str, Any]) -> str:
    parts = [str(row[k]) for k in IDENTITY if k in row and not isinstance(row[k], (dict, list))]
    return "/".join(parts)


def _stands_for(failed: Any, row: Any) -> bool:
    """``failed`` (a row with an ``error``) is ``row``'s result in the other run: every
    identity key it has, ``row`` has with the same value (an engine's error row has no
    ``size``)."""
    if not (isinstance(failed, Mapping) and isinstance(row, Mapping)) or "error" not in failed:
        return False
    keys = [k for k in IDENTITY if k in failed]
    return bool(keys) and all(k in row and row[k] == failed[k] for k in keys)


def _rows_by_id(rows: Sequence[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, row in enumerate(rows):
        ident = _row_id(row) if isinstance(row, Mapping) else ""
        ident = ident or f"#{i}"
        base, n = ident, 2
        while ident in out:  # two rows with one identity: keep both, in order
            ident, n = f"{base}~{n}", n + 1
        out[ident] = row
    return out


class _Walker:
    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance
        self.regressions: list[Regression] = []
        self.improvements: list[Regression] = []
        self.notes: list[str] = []
        self.mismatches: list[str] = []
        self.failures: list[str] = []
        self.checked = 0

    def walk(self, cur: Any, base: Any, label: str, path: str) -> None:
        if isinstance(cur, Mapping) and isinstance(base, Mapping):
            if "error" in cur and "error" not in base:  # its figures are gone, not slower
                self.failures.append(f"{label or 'the run'}: ran in the baseline, fails now: {cur['error']}")
                return
            if "error" in base and "error" not in cur:
                self.notes.append(f"{label or 'the run'}: failed in the baseline ({base['error']}), runs now; "
                                  "nothing to compare it with")
                return
            for key in list(base) + [k for k in cur if k not in base]:
                sub_label = f"{label}.{key}" if label else str(key)
                sub_path = f"{path}.{key}" if path else str(key)
                if key in ABSENT_BESIDE and (key not in cur or key not in base):
                    beside, default = ABSENT_BESIDE[key]
                    c_, b_ = (side.get(key, default if beside in side else None) for side in (cur, base))
                    if c_ is not None and b_ is not None:
                        self.leaf_or_walk(c_, b_, str(key), sub_label, sub_path, (cur, base))
                    else:
                        self.notes.append(f"{sub_label}: " + ("in the baseline only" if c_ is None
                                                               else "new, not in the baseline"))
                elif key in ABSENT_SETTINGS and (key not in cur or key not in base):
                    default = ABSENT_SETTINGS[key]
                    self.leaf_or_walk(cur.get(key, default), base.get(key, default), str(key), sub_label, sub_path,
                                      (cur, base))
                elif key not in cur:
                    self.notes.append(f"{sub_label}: in the baseline only")
                elif key not in base:
                    self.notes.append(f"{sub_label}: new, not in the baseline")
                else:
                    self.leaf_or_walk(cur[key], base[key], str(key), sub_label, sub_path, (cur, base))
        elif isinstance(cur, list) and isinstance(base, list):
            a, b = _rows_by_id(cur), _rows_by_id(base)
            a_only = [i for i in a if i not in b]
            paired: set[str] = set()  # rows of ``cur`` matched through an error row
            for ident in list(b) + a_only:
                sub_label = f"{label}[{ident}]"
                if ident in a and ident in b:
                    self.walk(a[ident], b[ident], sub_label, f"{path}[]")
                elif ident in b:  # an error row on either side has fewer identity keys than the row it stands for
                    other = next((i for i in a_only if (i not in paired or "error" in a[i])  # fails for each
                                  and (_stands_for(a[i], b[ident]) or _stands_for(b[ident], a[i]))), None)
                    if other is None:
                        self.notes.append(f"{sub_label}: in the baseline only")
                    else:
                        paired.add(other)
                        self.walk(a[other], b[ident], sub_label, f"{path}[]")
                elif ident not in paired:
                    self.notes.append(f"{sub_label}: new, not in the baseline")
        elif type(cur) is not type(base) and not (_number(cur) is not None and _number(base) is not None):
            self.notes.append(f"{label}: {type(base).__name__} in the baseline, {type(cur).__name__} now")

    def leaf_or_walk(self, cur: Any, base: Any, key: str, label: str, path: str,
                     parents: tuple[Mapping[str, Any], Mapping[str, Any]]) -> None:
        if isinstance(cur, (Mapping, list)) or isinstance(base, (Mapping, list)):
            self.walk(cur, base, label, path)
            return
        if key in SETTINGS and cur != base:
            self.mismatches.append(f"{label}: {_setting(key, base)} in the baseline, {_setting(key, cur)} now")
            return
        if key == "error":
            if cur != base:
                self.notes.append(f"{label}: {base!r} in the baseline, {cur!r} now")
            return
        if key in LOST and self.lost(cur, base, key, label, parents):
            return
        way = direction(path, key)
        if way is None:
            return
        c, b = _number(cur), _number(base)
        if c is None or b is None:
            if cur != base:
                self.notes.append(f"{label}: not comparable ({base!r} in the baseline, {cur!r} now)")
            return
        if way == "unknown":
            self.notes.append(f"{label}: no known direction for this ratio; not compared")
            return
        self.checked += 1
        if _memory_unit(key):
            self.memory(c, b, key, label)
            return
        if b == 0:
            if c != b:
                self.notes.append(f"{label}: baseline is 0, now {c:g}; no relative change")
            return
        change = (c - b) / abs(b)
        worse = change if way == LOWER else -change
        entry = Regression(label, b, c, change)
        if worse > self.tolerance:
            self.regressions.append(entry)
        elif -worse > self.tolerance:
            self.improvements.append(entry)

    def memory(self, c: float, b: float, key: str, label: str) -> None:
        """Judge a memory figure: worse by more than the tolerance and by more than its floor."""
        floor = MEMORY_FLOOR_POINTS if _memory_unit(key) == "points" else MEMORY_FLOOR_MB
        rise = c - b
        entry = Regression(label, b, c, rise / abs(b) if b else (math.inf if rise > 0 else -math.inf if rise else 0.0))
        if rise > floor and rise > self.tolerance * abs(b):
            self.regressions.append(entry)
        elif -rise > floor and -rise > self.tolerance * abs(b):
            self.improvements.append(entry)

    def lost(self, cur: Any, base: Any, key: str, label: str,
             parents: tuple[Mapping[str, Any], Mapping[str, Any]]) -> bool:
        """Judge a count of frames lost (``LOST``); False when they are not counts."""
        c, b = _number(cur), _number(base)
        if c is None or b is None or isinstance(cur, bool) or isinstance(base, bool):
            return False
        frames = [_number(p.get("frames")) for p in parents]  # as many frames as the run had
        if key == "analysed":  # the frames not analysed
            if frames[0] is None or frames[1] is None:
                frames = [b, b]  # no frame count beside it: the baseline's analysed ones
            c_lost, b_lost = frames[0] - c, frames[1] - b
        else:
            c_lost, b_lost = c, b
        rescaled = bool(frames[0] and frames[1] and frames[0] != frames[1])
        if rescaled:  # another --stream-frames (a mismatch too): as many lost per frame sent
            c_lost *= frames[1] / frames[0]
        self.checked += 1
        slack = LOST[key]
        slack = self.tolerance if slack is None else slack
        entry = Regression(label, b, c, (c - b) / abs(b) if b else (math.inf if c > b else 0.0))
        if c_lost > b_lost and (b_lost <= 0 or (c_lost - b_lost) / b_lost > slack):
            self.regressions.append(entry)
        elif not rescaled and c_lost < b_lost and b_lost > 0 and (b_lost - c_lost) / b_lost > self.tolerance:
            self.improvements.append(entry)
        return True


def diff_bench(current: Mapping[str, Any], baseline: Mapping[str, Any], tolerance: float = 0.15) -> BenchDiff:
    """Compare two ``medrt bench --json`` objects: regressions, improvements and notes."""
    if not isinstance(current, Mapping) or not isinstance(baseline, Mapping):
        raise TypeError('Arguments "current" and "baseline" must be bench JSON objects (dicts).')
    if not tolerance >= 0:
        raise ValueError(f'Argument "tolerance" must be >= 0 (0.15 = 15 %), got {tolerance!r}.')
    w = _Walker(tolerance)
    w.walk(current, baseline, "", "")
    return BenchDiff(tuple(w.regressions), tuple(w.notes), w.checked, tolerance, tuple(w.improvements),
                     tuple(w.mismatches), tuple(w.failures))


def compare(current: Mapping[str, Any], baseline: Mapping[str, Any], tolerance: float = 0.15) -> list[Regression]:
    """The figures of ``current`` that are worse than ``baseline`` by more than ``tolerance``
    (a fraction: 0.15 = 15 %). See the module docstring for which way is worse."""
    return list(diff_bench(current, baseline, tolerance).regressions)


def format_regressions(result: BenchDiff | Sequence[Regression], tolerance: float | None = None) -> str:
    """Regressions (and, given a :class:`BenchDiff`, improvements and notes) for people."""
    if isinstance(result, BenchDiff):
        diff = result
    else:
        diff = BenchDiff(tuple(result), tolerance=0.15 if tolerance is None else tolerance)
    tol = diff.tolerance if tolerance is None else tolerance

    def row(r: Regression) -> str:
        unit = _memory_unit(r.key.rsplit(".", 1)[-1])
        if unit:  # the rise too, which the floor judges (and the change alone when the baseline was 0)
            change = (f"{r.change:+.1%}, " if math.isfinite(r.change) else "") + f"{round(r.current - r.baseline, 1):+g} {unit}"
        else:
            change = f"{r.change:+.1%}" if math.isfinite(r.change) else "none in the baseline"
        return f"  {r.key}: {r.baseline:g} -> {r.current:g} ({change})"

    lines = []
    if diff.mismatches:
        lines += [f"not comparable: {len(diff.mismatches)} run setting(s) differ from the baseline's, so the "
                  "figures beside them measure another run (rerun with the baseline's settings):"]
        lines += [f"  {m}" for m in diff.mismatches]
    if diff.failures:
        lines += [f"failed: {len(diff.failures)} result(s) that ran in the baseline fail now:"]
        lines += [f"  {f}" for f in diff.failures]
    if diff.regressions:
        lines += [f"{len(diff.regressions)} regression(s) beyond {tol:.0%}:"] + [row(r) for r in diff.regressions]
    else:
        checked = f" ({diff.checked} figures compared)" if diff.checked else ""
        why = [w for w, on in (("the settings differ", diff.mismatches), ("results fail", diff.failures)) if on]
        but = f"; but {' and '.join(why)} (above)" if why else ""
        lines += [f"no regressions beyond {tol:.0%}{checked}{but}"]
    if diff.improvements:
        lines += [f"{len(diff.improvements)} improvement(s):"] + [row(r) for r in diff.improvements]
    if diff.notes:
        lines += ["notes:"] + [f"  {n}" for n in diff.notes]
    return "\n".join(lines)


def load_bench_json(path: str | Path, suites: Sequence[str] = ()) -> dict[str, Any]:
    """A saved ``medrt bench --json`` result; the error names the file and what is wrong.

    ``suites``: the top-level keys of the run it will be compared with
    (``stream_30fps``, ...); a baseline that holds none of them is refused, as
    the comparison would compare nothing and pass."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such baseline file; save one with `medrt bench --json > {path.name}`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a bench JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a bench JSON object (top level is {type(doc).__name__})")
    if suites and not any(isinstance(doc.get(s), (Mapping, list)) for s in suites):
        held = ", ".join(sorted(map(str, doc))) or "nothing"
        raise ValueError(f"{path}: no result of {', '.join(suites)} to compare with (the baseline holds {held}); "
                         "save one with `medrt bench --only ... --json` and the same suites")
    return doc
