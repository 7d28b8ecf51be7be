"""medrt: real-time medical-imaging inference.

Importing ``medrt`` pulls in neither Qt nor torch; the heavy optional parts
(GUI, GPU backends, training) live behind extras and are imported where used.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from medrt.errors import MedrtError

try:
    __version__ = version("medrt")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0.0.0+unknown"

__all__ = ["MedrtError", "__version__", "read_frames", "load_analyzer", "AnalyzerConfig"]


def read_frames(source, **kwargs):  # type: ignore[no-untyped-def]
    """Decode a DICOM path, bytes or Dataset into frames. See :func:`medrt.io.dicom.read_frames`."""
    from medrt.io.dicom import read_frames as _read_frames

    return _read_frames(source, **kwargs)


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``medrt.load_analyzer`` and ``medrt.AnalyzerConfig``, imported on first use."""
    if name in ("load_analyzer", "AnalyzerConfig", "Analyzer"):
        from medrt import analyzer

        return getattr(analyzer, name)
    raise AttributeError(f"module 'medrt' has no attribute {name!r}")
