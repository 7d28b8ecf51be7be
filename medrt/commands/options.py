"""Command-line options shared by the commands that run the analysis (stream, batch, bench, listen)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["add_engine_options", "add_pipeline_options", "add_seg_options", "analyzer_config", "thread_layout"]


def _count(text: str) -> int:
    """A whole number >= 0 (``--max-in-flight``; 0: no bound)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _millimetres(text: str) -> float:
    """A length in mm, >= 0 (``--min-diameter``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a length in mm, got {text!r}") from None
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0 mm, got {text}")
    return value


def alias_arg(text: str) -> tuple[str, str]:
    """``WORD=TERM`` (``--body-part-alias``)."""
    word, sep, term = text.partition("=")
    if not sep or not word.strip() or not term.strip():
        raise argparse.ArgumentTypeError(f"expected WORD=TERM (e.g. TORAX=CHEST), got {text!r}")
    return word.strip(), term.strip()


def add_runtime_options(g: Any) -> None:
    """``--backend``, ``--device`` and ``--precision`` (the engine options; ``medrt checks``)."""
    g.add_argument("--backend", default="auto", choices=("auto", "onnxruntime", "tensorrt", "torch"),
                   help="runtime (default: the best one this machine allows; a fallback is logged)")
    g.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    g.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "int8"),
                   help="int8 on the CPU: each model is quantized and gated on first use (cached); one that loses more"
                        " than 1 point of Dice or sensitivity runs in fp32, with a warning")


def add_routing_options(g: Any, *, when: str = "") -> None:
    """``--body-part-alias`` and ``--strict-routing`` (the engine options; ``medrt info
    --route``, whose help says ``when`` they apply)."""
    g.add_argument("--body-part-alias", action="append", type=alias_arg, default=[], metavar="WORD=TERM",
                   help=f"{when}read this site's BodyPartExamined word as a term the models list (e.g. TORAX=CHEST; "
                        "repeatable). A value is matched as a whole or by its words, so CHEST PA is CHEST already")
    g.add_argument("--strict-routing", action="store_true",
                   help=f"{when}refuse an image whose header names no body part (BodyPartExamined) or view "
                        "(ViewPosition) where the model lists the ones it is for (default: such an image is taken, "
                        "as many rooms leave BodyPartExamined empty)")


#: The segmenters by default (AnalyzerConfig.seg_model's; named here so that building the
#: command line does not import the analysis).
DEFAULT_SEG_MODEL = "lesion_unet_lite,lesion_unet_dx"


def add_engine_options(p: argparse.ArgumentParser, *, seg_model: str = DEFAULT_SEG_MODEL) -> None:
    g = p.add_argument_group("inference engine")
    add_runtime_options(g)
    g.add_argument("--mode", default="auto", choices=("auto", "roi", "full"),
                   help="roi: thumbnail classifier + 1024² crops; full: sliding window over the frame; auto"
                        " (default): full for frames much finer than the UNet's spacing (radiographs), frames that"
                        " fit in one crop (CT slices) or with no ROI classifier for their modality, roi for the rest")
    g.add_argument("--no-recheck", action="store_true",
                   help="skip the 2x re-check of small lesions and the 2x fine sweep of radiographs")
    g.add_argument("--min-diameter", type=_millimetres, default=1.5, metavar="MM",
                   help="report no lesion shorter than this (longest diameter, mm; default 1.5: the smallest"
                        " lesions the models are scored on are 2 mm, and most 1-2 pixel CT marks are noise; 0: all)")
    g.add_argument("--model", default=seg_model,
                   help="segmentation model name or .toml spec; several, comma-separated, route frames by the"
                        f" modalities their specs list, as --roi-model does (default {seg_model}: CT slices to the"
                        " 2.5-D lesion_unet_lite, radiographs to lesion_unet_dx; lesion_unet takes both)")
    g.add_argument("--roi-model", default=None,
                   help="ROI classifier name or .toml spec; several, comma-separated, route frames by"
                        " the modalities their specs list, the first that lists none taking the rest"
                        " (default roi_classifier,roi_classifier_dx)")
    g.add_argument("--threads", type=int, default=None,
                   help="threads per model session (default: 1 per inference worker on CPU)")
    add_routing_options(g)


def add_pipeline_options(p: argparse.ArgumentParser, *, policy: str | None) -> None:
    """``policy`` None: the command always blocks (batch never drops), so no --policy."""
    g = p.add_argument_group("pipeline")
    if policy is not None:
        g.add_argument("--policy", default=None, choices=("block", "latest", "reject"),
                       help=f"what the entry queue does when the pipeline falls behind its source: block "
                            f"(never drop; the source waits), latest (drop the oldest waiting frame), reject "
                            f"(refuse the new one); inner queues always block. Default {policy}")
        g.add_argument("--max-in-flight", type=_count, default=None, metavar="N",
                       help="frames past the entry at once; 0: unbounded. Default: with latest, the widest stage's "
                            "workers (the inference workers) + 2, so a pipeline that falls behind drops stale frames at the entry instead "
                            "of queueing them inside (latency); otherwise unbounded")
    g.add_argument("--depth", type=int, default=None,
                   help="queue capacity per edge (default: from the measured stage times, seed rule)")
    g.add_argument("--workers", type=int, default=None,
                   help="inference workers (default: one per core on CPU, one on a GPU)")
    g.add_argument("--decode-workers", type=int, default=1, help="decode/preprocess workers (default 1)")
    g.add_argument("--decode-processes", type=int, default=0,
                   help="decode files in N worker processes (pylibjpeg's JPEG and RLE codecs hold the GIL for a "
                        "whole image; default 0: decode on a pipeline thread)")
    g.add_argument("--processes", type=int, default=0,
                   help="decode and analyse files in N worker processes, each with its own models, instead of "
                        "pipeline threads: on a CPU backend this sidesteps Python's interpreter lock, for machines "
                        "with many cores (see README, Performance); default 0: threads")


LOOKAHEAD_MISUSE = "--lookahead takes seconds >= 0 and goes with --watch"
#: A watched folder's files wait at most this long for the next one, when a 2.5-D model
#: needs it and ``--lookahead`` is not given.
DEFAULT_LOOKAHEAD_S = 0.5


def lookahead_misused(args: argparse.Namespace) -> bool:
    """``--lookahead`` holds the files of a watched folder (``medrt stream``, ``medrt
    view``): a negative value, or one > 0 without ``--watch``, is a mistake to report."""
    return args.lookahead is not None and (args.lookahead < 0 or bool(args.lookahead and not args.watch))


def watch_lookahead(source: Any, seconds: float | None) -> Any:
    """A watched folder's source wrapped in :class:`medrt.io.sources.Lookahead`: ``seconds``
    None (``--lookahead`` not given) lets each file through at once unless a 2.5-D model
    asks for the next slices (then each waits up to :data:`DEFAULT_LOOKAHEAD_S` for it);
    > 0 holds each for the next file, at most that long; 0 never holds one."""
    from medrt.io.sources import Lookahead

    if seconds is None:
        return Lookahead(source, DEFAULT_LOOKAHEAD_S, depth=0)
    return Lookahead(source, seconds) if seconds > 0 else source


def add_seg_options(p: argparse.ArgumentParser) -> None:
    """How the DICOM SEG is written (``medrt batch``, ``medrt listen``): its empty frames and
    its compression; read back as ``args.omit_empty_frames`` and ``args.seg_compression``."""
    frames = p.add_mutually_exclusive_group()
    frames.add_argument("--omit-empty-frames", dest="omit_empty_frames", action="store_const", const=True,
                        default=None, help="keep only the SEG frames a lesion is on (the default with two "
                                           "or more lesions: a segment per lesion)")
    frames.add_argument("--keep-empty-frames", dest="omit_empty_frames", action="store_const", const=False,
                        help="keep every image's frame for every lesion's segment (the default with one "
                             "lesion; some viewers misplace SEGs that omit frames)")
    p.add_argument("--seg-compression", choices=("none", "jpeg2000"), default="none",
                   help="the SEG's transfer syntax: none (Explicit VR Little Endian, the default: every "
                        "archive takes it) or jpeg2000 (JPEG 2000 Lossless: a 4096² radiograph's SEG "
                        "shrinks from 2 MiB per lesion to a few KiB; a peer that refuses it is sent the "
                        "SEG uncompressed)")


def thread_layout(args: argparse.Namespace) -> tuple[int | None, int]:
    """(threads per model session, inference workers) for this process's cores and the
    command's engine options (:func:`medrt.engine.hardware.cpu_layout`)."""
    from medrt.bands import usable_cores
    from medrt.engine.hardware import cpu_layout, on_gpu

    gpu = on_gpu(getattr(args, "backend", "auto"), getattr(args, "device", "auto"))
    # the cores this process may use (affinity mask)
    return cpu_layout(usable_cores(), gpu=gpu, workers=getattr(args, "workers", None), threads=args.threads)


def analyzer_config(args: argparse.Namespace, **overrides: Any) -> Any:
    from medrt.analyzer import AnalyzerConfig

    threads, _ = thread_layout(args)
    fields: dict[str, Any] = dict(
        mode=args.mode, backend=args.backend, device=args.device, precision=args.precision,
        seg_model=args.model, recheck=not args.no_recheck, threads=threads,
        min_diameter_mm=getattr(args, "min_diameter", 1.5),
        body_part_aliases=dict(getattr(args, "body_part_alias", None) or ()),
        strict_routing=getattr(args, "strict_routing", False),
    )
    if args.roi_model:
        fields["roi_model"] = args.roi_model
    fields.update(overrides)
    return AnalyzerConfig(**fields)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (systemd, a job scheduler, ``kill``, ``timeout``) stops a batch or a stream as
    Ctrl-C does (a KeyboardInterrupt in the main thread): finished series kept and the report
    written, or the stream's summary printed, exit 130. It used to kill the process outright."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
