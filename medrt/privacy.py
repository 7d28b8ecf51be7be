"""Keeping patient data out of what medrt prints and logs.

medrt's own messages name files by path and objects by UID, never by a patient's
name or ID. The libraries it calls are not so careful: highdicom warns with the
patient's name when it looks like a single-component person name (``The string
"DOE" is unlikely to represent ...``), and pydicom warns and raises with the bad
value itself (``Invalid value for VR DA: '1970-01-01'``, a birth date). Those
messages reach the console, the run's log and ``errors.csv``.

:func:`redact` takes every quoted value out of such a message; :class:`RedactFilter`
applies it to the log records of pydicom, highdicom and pynetdicom and to Python
warnings, which :func:`install_log_redaction` routes into logging (the command line
and the viewer call it at start-up). :func:`describe_exception` is the one way to
turn a library's exception into a reason for a report.
"""

from __future__ import annotations

import collections
import logging
import re

__all__ = ["redact", "RedactFilter", "EchoFilter", "install_log_redaction", "describe_exception"]

# A value between single or double quotes, on one line: how pydicom and highdicom quote
# the values they complain about (repr() of a string, or an f-string's "...").
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
# Loggers whose messages may carry header values: the DICOM libraries, and Python
# warnings once logging.captureWarnings routes them to "py.warnings".
THIRD_PARTY = ("pydicom", "highdicom", "pynetdicom", "py.warnings")


def redact(text: str) -> str:
    """``text`` with every quoted value replaced by an ellipsis in the same quotes."""
    return _QUOTED.sub(lambda m: f"{m.group(0)[0]}…{m.group(0)[0]}", text)


def _third_party(record: logging.LogRecord) -> bool:
    """Whether ``record`` comes from one of the :data:`THIRD_PARTY` loggers or their children."""
    return any(record.name == name or record.name.startswith(name + ".") for name in THIRD_PARTY)


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:  # a library's bad format string must not raise from its log call
        return str(record.msg)


class RedactFilter(logging.Filter):
    """Redacts (:func:`redact`) the records of the :data:`THIRD_PARTY` loggers; medrt's
    own records pass unchanged. Put it on a handler: a logger's filters do not see its
    children's records (``highdicom.base``, ``highdicom.sr.sop``, ...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _third_party(record):
            record.msg, record.args = redact(_message(record)), None
        return True


class EchoFilter(logging.Filter):
    """Drops a Python warning that repeats what a DICOM library has just logged.

    pydicom's ``warn_and_log`` logs a message and then warns with the same text, so with
    warnings routed into logging every such message came out twice, the second time with
    a source path and line (``medrt batch`` over pydicom's test files: each
    "Expected explicit VR, but found implicit VR" twice). The logged record is kept. Put
    it on the handler after :class:`RedactFilter`, which both records then went through."""

    def __init__(self, remember: int = 16) -> None:
        super().__init__()
        self._recent: collections.deque[str] = collections.deque(maxlen=remember)

    def filter(self, record: logging.LogRecord) -> bool:
        text = _message(record)
        if record.name == "py.warnings":
            return not any(seen in text for seen in self._recent)
        if record.levelno >= logging.WARNING and text and _third_party(record):
            self._recent.append(text)
        return True


def install_log_redaction(handlers: list[logging.Handler] | None = None) -> None:
    """Route Python warnings into logging, redact third-party records, drop the echo of
    a warning a library has just logged (:class:`EchoFilter`) and name the file a DICOM
    library's warning is about, once per file (:class:`medrt.logsource.SourceFilter`) on
    ``handlers`` (default: the root logger's, so call it after ``logging.basicConfig``).
    Idempotent."""
    from medrt.logsource import SourceFilter

    logging.captureWarnings(True)
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not any(isinstance(f, RedactFilter) for f in handler.filters):
            handler.addFilter(RedactFilter())
        if not any(isinstance(f, EchoFilter) for f in handler.filters):
            handler.addFilter(EchoFilter())
        if not any(isinstance(f, SourceFilter) for f in handler.filters):
            handler.addFilter(SourceFilter())  # last: the filters above see the library's own text


def setup_console_logging(level: int, fmt: str = "%(asctime)s %(levelname)s %(name)s: %(message)s") -> None:
    """Log to stderr at ``level`` with :func:`install_log_redaction` (the command line's and
    a Ray worker's setup). Where this call makes the root handler, the handler gets
    ``level`` too: pydicom sets its own logger's level (WARNING), which passes its
    warnings past a root level of ERROR (``--quiet``). Above DEBUG, pydicom's traceback of
    each decoder plugin before it gives up on a frame is hidden: medrt reports the file
    and the reason in one line and goes on, and the tracebacks only look like a crash."""
    import sys

    root = logging.getLogger()
    ours = not root.handlers
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)
    if ours:
        for handler in root.handlers:
            handler.setLevel(level)
    install_log_redaction()
    if level > logging.DEBUG:
        logging.getLogger("pydicom.pixels.decoders.base").setLevel(logging.CRITICAL)


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"`` for a report, the message's quoted values redacted: a library's
    exception may quote a header value (pydicom: ``Unable to convert '1970-01-01' to 'DA'
    object``). medrt's own errors carry no header values and are kept whole."""
    from medrt.errors import MedrtError

    if isinstance(exc, MedrtError) or _names_a_missing_keyword(str(exc)):
        text = str(exc)
    else:
        text = redact(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


_NO_ATTRIBUTE = re.compile(r"'[A-Za-z_]\w*' object has no attribute '([A-Za-z_]\w*)'")


def _names_a_missing_keyword(text: str) -> bool:
    """Whether ``text`` is Python's "'Dataset' object has no attribute 'PixelSpacing'" for
    a DICOM keyword: a class name and a keyword, no header value, and the whole reason."""
    from pydicom.datadict import tag_for_keyword

    m = _NO_ATTRIBUTE.fullmatch(text)
    return m is not None and tag_for_keyword(m.group(1)) is not None
