"""Headless batch folder mode: ``medrt batch INPUT --out OUT``."""

from medrt.batch.outputs import OutputOptions, frame_record
from medrt.batch.run import (
    EXIT_ERRORS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BatchConfig,
    BatchSummary,
    run_batch,
)

__all__ = ["BatchConfig", "BatchSummary", "OutputOptions", "frame_record", "run_batch",
           "EXIT_OK", "EXIT_ERRORS", "EXIT_FAILED", "EXIT_INTERRUPTED"]
