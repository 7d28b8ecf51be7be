"""The analysis path as pipeline stages: decode → preprocess → roi → segment → postprocess.

Every face builds its pipeline from :func:`analysis_stages` and chooses only its
source, sinks and queue policy, so the viewer, the batch and the listener run
the same code the serial ``Analyzer.analyze`` runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrt.analyzer import Analyzer
from medrt.io.dicom import read_frames
from medrt.pipeline.graph import Stage
from medrt.types import Frame

__all__ = ["Decoded", "STAGE_NAMES", "decode", "analysis_stages"]

STAGE_NAMES = ("decode", "preprocess", "roi", "segment", "postprocess")


@dataclass(frozen=True, slots=True, eq=False)
class Decoded:
    """One decoded frame and its share of the time it took to decode its file."""

    frame: Frame
    decode_ms: float

    @property
    def key(self) -> str:
        return self.frame.key


def decode(item: Any) -> list[Decoded]:
    """A path (or bytes, or an already decoded Frame) → one :class:`Decoded` per frame.
    Bad input raises an :class:`~medrt.errors.InputError` that names the file."""
    if isinstance(item, Frame):
        return [Decoded(item, 0.0)]
    t0 = time.perf_counter()
    frames = read_frames(item if not isinstance(item, (str, os.PathLike)) else Path(item))
    ms = (time.perf_counter() - t0) * 1000.0 / max(1, len(frames))
    return [Decoded(f, ms) for f in frames]


def analysis_stages(
    analyzer: Analyzer,
    *,
    mode: str | None = None,
    recheck: bool | None = None,
    decode_workers: int = 1,
    infer_workers: int = 1,
    decoder: Callable[[Any], list[Decoded]] = decode,
) -> list[Stage]:
    """The five stages around one loaded analyzer. ``infer_workers`` > 1 runs several
    frames through the ROI classifier and the UNet at once (useful when each
    backend session uses fewer threads than there are cores)."""

    def preprocess(d: Decoded) -> Any:
        return analyzer.prepare(d.frame, decode_ms=d.decode_ms, mode=mode, recheck_small=recheck)

    return [
        Stage("decode", decoder, workers=decode_workers, fan_out=True),
        Stage("preprocess", preprocess, workers=decode_workers),
        Stage("roi", analyzer.propose, workers=infer_workers),
        Stage("segment", analyzer.segment, workers=infer_workers),
        Stage("postprocess", analyzer.finish, workers=1),
    ]
