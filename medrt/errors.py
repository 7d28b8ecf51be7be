"""The medrt exception tree.

Every error that reaches a user names the input it is about and the reason, so a
batch run or the listener can log it, list it in ``errors.csv`` and go on.
Callers tell the kinds apart by class:

``MedrtError``
    ``InputError`` (bad input; carries ``source`` and ``reason``)
        ``NotDicomError``            not DICOM at all
        ``CorruptDicomError``        DICOM, but the header cannot be parsed
        ``NoPixelDataError``         a DICOM object without pixel data
        ``NotAnImageError``          an object that is not an image (SR, SEG, RT Dose, ...)
        ``CorruptPixelDataError``    pixel data truncated, the wrong length, or undecodable
        ``UnsupportedImageError``    an image medrt cannot analyse (unknown syntax, odd layout)
        ``DecoderMissingError``      the decoder plugin for the transfer syntax is not installed
"""

from __future__ import annotations

from os import PathLike

__all__ = [
    "MedrtError",
    "InputError",
    "NotDicomError",
    "CorruptDicomError",
    "IncompleteHeaderError",
    "NoPixelDataError",
    "NotAnImageError",
    "CorruptPixelDataError",
    "UnsupportedImageError",
    "DecoderMissingError",
    "describe_source",
    "source_name",
    "drop_tracebacks",
]


class MedrtError(Exception):
    """Base class of every error medrt raises on purpose."""


def drop_tracebacks(exc: BaseException) -> BaseException:
    """``exc`` with no traceback on it or on its cause and context; returned for chaining.

    For an exception kept after it was handled (a file's reason in a batch's error list):
    a traceback holds the frames it passed through and each of them the frame that called
    it, with all their locals, so a kept one held a whole batch run's frames, pipeline and
    pixels, and made a cycle with the list that kept it (freed only by a full collection,
    many series later in a listener). medrt reports the reason, never the traceback."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        if current.__cause__ is not None and id(current.__cause__) not in seen:
            drop_tracebacks(current.__cause__)
        current = current.__context__
    return exc


def source_name(source: object) -> object:
    """What to name ``source`` by: an open file's path (its ``name``, where that is a str or a
    path) for the file object, which would otherwise be named ``<BufferedReader>``; ``source``
    itself otherwise (a path, bytes, a Dataset, a ``BytesIO``, which has no name, or a file
    opened from a descriptor, whose name is a number)."""
    if isinstance(source, (str, PathLike, bytes, bytearray, memoryview)) or not hasattr(source, "read"):
        return source
    try:
        name = getattr(source, "name", None)
    except Exception:  # a file-like object whose name is a property that fails
        return source
    return name if isinstance(name, (str, PathLike)) and str(name) else source


def describe_source(source: object) -> str:
    """A short, PHI-free name for an input: a path as given, an open file's path, or the
    kind of object."""
    source = source_name(source)
    if isinstance(source, (str, PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    if source is None:
        return "<unknown input>"
    try:
        uid = getattr(source, "SOPInstanceUID", None)
    except Exception:  # a damaged header: the UID itself may be unreadable
        uid = None
    if uid:
        return f"<dataset {uid}>"
    return f"<{type(source).__name__}>"


class InputError(MedrtError):
    """An input medrt cannot use. ``source`` names it; ``reason`` says why."""

    kind = "bad input"

    def __init__(self, source: object, reason: str) -> None:
        self.source = describe_source(source)
        self.reason = reason
        super().__init__(f"{self.source}: {self.kind}: {reason}")

    @property
    def why(self) -> str:
        """What is wrong, without the source (for a report or log line that names it)."""
        return f"{self.kind}: {self.reason}"

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable with its fields, so an error raised in a decode process arrives whole.
        state = {k: v for k, v in self.__dict__.items() if k not in ("source", "reason")}
        return (_rebuild_input_error, (type(self), self.source, self.reason, state))


def _rebuild_input_error(cls: type[InputError], source: str, reason: str, state: dict[str, object]) -> InputError:
    err = cls.__new__(cls)
    MedrtError.__init__(err, f"{source}: {cls.kind}: {reason}")
    err.source, err.reason = source, reason
    err.__dict__.update(state)
    return err


class NotDicomError(InputError):
    kind = "not a DICOM file"
    #: A folder of images often holds other files too (reports, JSON, thumbnails):
    #: batch and stream pass over them with a note, not as errors.
    skippable = True


class CorruptDicomError(InputError):
    kind = "corrupt DICOM"


class IncompleteHeaderError(CorruptDicomError):
    """A readable image whose header lacks what grouping needs (Study or Series Instance
    UID): not damaged, and ``medrt info`` decodes it, but it belongs to no series."""

    kind = "incomplete header"


class NoPixelDataError(InputError):
    kind = "no pixel data"


class NotAnImageError(InputError):
    """A DICOM object that holds no image (SR, SEG, presentation state, RT plan, a
    DICOMDIR...). A scanner's export or a PACS spool holds these beside the images:
    batch, stream and the viewer pass over them with a note, not as errors (``medrt
    info``, which inspects files, still reports them)."""

    kind = "not an image"
    skippable = True


class CorruptPixelDataError(InputError):
    kind = "corrupt pixel data"


class UnsupportedImageError(InputError):
    kind = "unsupported image"


class NoModelForImageError(UnsupportedImageError):
    """A frame of a modality none of the loaded models was made for (their specs'
    ``[model] modalities``). Batch and stream pass over it with a note, as over a
    file that is not an image: it is not for this run, not broken."""

    kind = "no model for this image"
    skippable = True


class DecoderMissingError(InputError):
    """No installed plugin can decode the transfer syntax. ``packages`` lists what to install."""

    kind = "decoder missing"

    def __init__(self, source: object, reason: str, packages: tuple[str, ...] = ()) -> None:
        self.packages = packages
        if packages:
            reason = f"{reason}; install it with: pip install {' '.join(packages)}"
        super().__init__(source, reason)
