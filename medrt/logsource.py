"""Naming the input file in the DICOM libraries' own log lines, once per file.

pydicom warns while it parses a damaged header ("Invalid value for VR IS: '…'",
"The length of the pixel data ... is not even"), through its logger and Python's
warnings. Those lines named no file: a batch over a folder of bad files printed a
column of them, each repeated for every element and every pass over the header (the
scan, then the decode), and nobody could tell which file they were about.

:func:`reading` marks the input a thread is parsing (``medrt.io.dicom`` wraps its
reads in it); :class:`SourceFilter`, on the console's handler, puts that input's name
(a path or a UID, never patient data: :func:`medrt.errors.describe_source`) in front
of each such record, takes out pydicom's link to the VR table, and lets each message
through once per input. Records from outside a read pass unchanged.

An open file is named by its path (:func:`medrt.errors.source_name`: its ``name``), not ``<BufferedReader>``.
"Once per input" is once per path (the scan and the decode read a file twice) or per
SOPInstanceUID of a Dataset; an input known by nothing unique (bytes, a ``BytesIO``, a
Dataset without a UID: ``<BytesIO>``, ``<39198 bytes>``) is one input per read, so two
of them whose names match are not taken for one and the second's warnings are not lost.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import itertools
import logging
import os
import re
import threading
from collections.abc import Iterator

__all__ = ["reading", "current_source", "SourceFilter"]

# (the input's name, the key its messages are passed once under) while it is read
_SOURCE: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("medrt_reading", default=None)
_READS = itertools.count(1)  # numbers each read of an input known by nothing unique
# The loggers whose records are about the input being parsed: pydicom's, and Python's
# warnings once logging.captureWarnings routes them to "py.warnings".
_ABOUT_INPUT = ("pydicom", "py.warnings")
_NAMED = "medrt_source_text"  # on a record named already: its text before the name
_VR_LINK = re.compile(r"\s*Please see <[^>]*> for allowed values for each VR\.?")


@contextlib.contextmanager
def reading(source: object) -> Iterator[None]:
    """Mark ``source`` as the input this thread is parsing, for :class:`SourceFilter`.
    Nested reads of the same input keep the outer mark."""
    from medrt.errors import describe_source, source_name

    if _SOURCE.get() is not None:
        yield
        return
    source = source_name(source)
    name = describe_source(source)
    token = _SOURCE.set((name, name if _unique(source, name) else f"{name}#{next(_READS)}"))
    try:
        yield
    finally:
        _SOURCE.reset(token)


def _unique(source: object, name: str) -> bool:
    """Whether ``name`` (:func:`describe_source`'s) tells ``source`` from every other input:
    a path, or a Dataset's SOPInstanceUID; not ``<BytesIO>`` or ``<39198 bytes>``."""
    return isinstance(source, (str, os.PathLike)) or name.startswith("<dataset ")


def current_source() -> str | None:
    """The input this thread is parsing (:func:`reading`), or None."""
    mark = _SOURCE.get()
    return mark[0] if mark is not None else None


class SourceFilter(logging.Filter):
    """Names the input in pydicom's records and Python warnings logged while it is read,
    and passes each message once per input (the last ``remember`` inputs are kept).
    Put it on a handler after :class:`medrt.privacy.RedactFilter` and
    :class:`medrt.privacy.EchoFilter`, which then see the library's own text."""

    def __init__(self, remember: int = 64) -> None:
        super().__init__()
        self._seen: collections.OrderedDict[str, set[str]] = collections.OrderedDict()
        self._remember = remember
        self._lock = threading.Lock()  # a handler's filters run outside its lock

    def filter(self, record: logging.LogRecord) -> bool:
        mark = _SOURCE.get()
        if mark is None or not any(record.name == n or record.name.startswith(n + ".") for n in _ABOUT_INPUT):
            return True
        # The record is one object for every handler: one that a SourceFilter before (on
        # another handler: a console and a log file) has named keeps its text and name.
        text = getattr(record, _NAMED, None)
        if text is None:
            try:
                text = record.getMessage()
            except Exception:
                text = str(record.msg)
            text = _VR_LINK.sub("", text)
            if record.name == "py.warnings":  # "path/to/module.py:402: UserWarning: text\n  source line"
                text = text.strip().splitlines()[0] if text.strip() else text
        source, key = mark
        with self._lock:
            seen = self._seen.setdefault(key, set())
            self._seen.move_to_end(key)
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
            if text in seen:
                return False
            seen.add(text)
        record.msg, record.args = f"{source}: {text}", None
        setattr(record, _NAMED, text)
        return True
