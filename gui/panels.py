"""The side panels: series browser (with the problems met), lesion list, and display controls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from medrt_gui.study import Problem, Study
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QSlider,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from medrt.overlay import lesion_color
from medrt.types import Lesion

__all__ = ["SeriesBrowser", "LesionList", "LesionRow", "SeriesLesionTable", "Controls", "LESION_COLUMNS", "FOLLOW_MODES"]

#: Following a live stream shows ... (the combo box's text, the mode's name).
FOLLOW_MODES = (("the newest AI result", "results"), ("the newest image", "images"))

LESION_COLUMNS = ("#", "slice", "diam. mm", "area mm²", "vol. mm³", "score", "recheck")


@dataclass(frozen=True, slots=True)
class LesionRow:
    """Where a section stands in its lesion: the lesion's number in the series, which of
    its slices this is (1-based) of how many, and the lesion's volume (None: unknown)."""

    number: int
    slice: int
    slices: int
    volume_mm3: float | None


class SeriesBrowser(QWidget):
    """The series of the open study or stream, and the files that could not be shown."""

    seriesSelected = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.source = QLabel("Nothing open. File ▸ Open, Watch or Replay.")
        self.source.setWordWrap(True)
        self.series = QListWidget()
        self.series.currentRowChanged.connect(self._selected)
        self.problems = QListWidget()
        self.problems.setWordWrap(True)
        self.problems_label = QLabel("Problems")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.source)
        layout.addWidget(QLabel("Series"))
        layout.addWidget(self.series, 3)
        layout.addWidget(self.problems_label)
        layout.addWidget(self.problems, 1)
        self._updating = False

    def _selected(self, row: int) -> None:
        if not self._updating and row >= 0:
            self.seriesSelected.emit(row)

    def show_study(self, study: Study, current: int, show_patient: bool = True) -> None:
        """Refresh the lists (cheap: a few rows) without re-emitting a selection. When the
        series belong to several patients, a warning heads them and (unless
        ``show_patient`` is off) each row starts with its patient's name."""
        self._updating = True
        try:
            warning = study.patients_warning
            self.source.setText("\n".join(t for t in (study.title, warning) if t))
            texts = [(f"{e.patient.name or e.patient.patient_id} · " if warning and show_patient and e.patient else "")
                     + f"{e.description}  [{e.analysed}/{len(e.slots)} analysed]" for e in study.series]
            if [self.series.item(i).text() for i in range(self.series.count())] != texts:
                self.series.clear()
                self.series.addItems(texts)
            if 0 <= current < self.series.count() and self.series.currentRow() != current:
                self.series.setCurrentRow(current)
            if self.problems.count() != len(study.problems):
                self.problems.clear()
                for p in study.problems:
                    self._add_problem(p)
            # images that failed, as the status bar counts them; SEGs that could not be laid
            # over their images apart (the two counts disagreed by those)
            failed = sum(1 for p in study.problems if not p.skipped and not p.seg)
            segs = sum(1 for p in study.problems if p.seg and not p.skipped)
            skipped = sum(1 for p in study.problems if p.skipped)
            self.problems_label.setText(f"Problems: {failed} unreadable, " + (f"{segs} SEG(s) not shown, " if segs else "")
                                        + f"{skipped} skipped")
        finally:
            self._updating = False

    def _add_problem(self, problem: Problem) -> None:
        item = QListWidgetItem(("note: " if problem.skipped else "") + str(problem))
        item.setToolTip(str(problem))
        if not problem.skipped:
            item.setForeground(QColor(200, 40, 40))
        self.problems.addItem(item)


def _read_only_rows(table: QTableWidget, columns: Sequence[str]) -> None:
    """A table of whole rows to click on: headers ``columns``, not editable, one row selected."""
    table.setHorizontalHeaderLabels(list(columns))
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.setFocusPolicy(Qt.FocusPolicy.ClickFocus)


def _set_header(table: QTableWidget, col: int, text: str) -> None:
    """Head column ``col`` with ``text`` (its lines joined in the tooltip), unless it is already."""
    item = table.horizontalHeaderItem(col)
    if item is None or item.text() != text:
        item = QTableWidgetItem(text)
        item.setToolTip(text.replace("\n", " "))
        table.setHorizontalHeaderItem(col, item)


def _header(name: str, unit: str) -> str:
    """A size column's header: ``name`` and the unit, then what qualifies the unit on a line
    of its own ("diam. mm" / "at detector")."""
    unit, _, where = unit.partition(" ")
    return f"{name} {unit}" + (f"\n{where}" if where else "")


class LesionList(QTableWidget):
    """The lesions of the shown frame; clicking one emits ``lesionActivated``."""

    lesionActivated = Signal(object)  # Lesion

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(LESION_COLUMNS), parent)
        _read_only_rows(self, LESION_COLUMNS)
        self.setMinimumWidth(300)
        self.lesions: tuple[Lesion, ...] = ()
        self.rows: tuple[LesionRow, ...] = ()
        self.cellClicked.connect(lambda row, _col: self.activate(row))

    def show_lesions(self, lesions: tuple[Lesion, ...], rows: Sequence[LesionRow] | None = None,
                     units: tuple[str, str] = ("mm", "mm²")) -> None:
        """The lesions of the image shown; ``rows`` (one per lesion) number them as lesions of
        the series, a lesion on several slices keeping its number on each. ``units``: the
        image's length and area units (:func:`medrt_gui.measure.size_units`: a radiograph's
        sizes are at the detector unless its header gives the magnification, an image
        without spacing is measured in pixels), which head the size columns: the unit on
        the first line, where it is measured on a second ("diam. mm" / "at detector"), so
        the diameter stays in sight in a narrow panel."""
        headers = list(LESION_COLUMNS)
        headers[2], headers[3] = _header("diam.", units[0]), _header("area", units[1])
        for col, text in enumerate(headers):
            _set_header(self, col, text)
        rows = tuple(rows) if rows is not None else tuple(LesionRow(i + 1, 1, 1, None) for i in range(len(lesions)))
        if (lesions, rows) == (self.lesions, self.rows):
            return
        self.lesions, self.rows = tuple(lesions), rows
        self.setRowCount(len(self.lesions))
        for row, (les, where) in enumerate(zip(self.lesions, rows, strict=True)):
            volume = "–" if where.volume_mm3 is None else f"{where.volume_mm3:.0f}"
            cells = (str(where.number), f"{where.slice}/{where.slices}", f"{les.diameter_mm:.1f}",
                     f"{les.area_mm2:.1f}", volume, f"{les.score:.2f}", "yes" if les.rechecked else "no")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == 0:
                    item.setForeground(QColor(*lesion_color(max(les.label, 1))))
                self.setItem(row, col, item)

    def activate(self, row: int) -> None:
        if 0 <= row < len(self.lesions):
            self.selectRow(row)
            self.lesionActivated.emit(self.lesions[row])


SERIES_LESION_COLUMNS = ("#", "slices", "longest mm", "vol. mm³", "score")


class SeriesLesionTable(QTableWidget):
    """Every lesion of the series shown, each once (its sections on neighbouring slices
    joined); a click goes to the slice where it is largest."""

    lesionChosen = Signal(object)  # a medrt.analysis.tracking.SeriesLesion

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(SERIES_LESION_COLUMNS), parent)
        _read_only_rows(self, SERIES_LESION_COLUMNS)
        self.lesions: tuple[Any, ...] = ()
        self.cellClicked.connect(lambda row, _col: self.activate(row))

    def show_series_lesions(self, lesions: Sequence[Any], unit: str = "mm") -> None:
        """Every lesion of the series once; ``unit`` (the series' length unit, :func:`medrt_gui.
        measure.size_units`) heads the longest-diameter column as in the "This image" tab."""
        _set_header(self, 2, _header("longest", unit))
        if tuple(lesions) == self.lesions:
            return
        self.lesions = tuple(lesions)
        self.setRowCount(len(self.lesions))
        for row, les in enumerate(self.lesions):
            volume = "–" if les.volume_mm3 is None else f"{les.volume_mm3:.0f}"
            longest = f"{les.diameter_mm:.1f}" + ("" if les.in_mm else " px")
            for col, text in enumerate((str(les.number), str(les.slices), longest, volume, f"{les.score:.2f}")):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.setItem(row, col, item)

    def activate(self, row: int) -> None:
        if 0 <= row < len(self.lesions):
            self.selectRow(row)
            self.lesionChosen.emit(self.lesions[row])


class Controls(QWidget):
    """Overlay toggles and opacity, crop boxes, SEG layer, following a stream, cine and replay rates."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.overlay = QCheckBox("AI overlay (g)")
        self.overlay.setChecked(True)
        self.opacity = QSlider(Qt.Orientation.Horizontal)
        self.opacity.setRange(0, 100)
        self.opacity.setValue(100)
        self.opacity.setToolTip("Overlay opacity: 100 % draws fill at alpha 0.2 and outline at 0.7")
        self.crops = QCheckBox("ROI crop boxes")
        self.seg = QCheckBox("DICOM SEG layer")
        self.seg.setChecked(True)
        self.follow = QCheckBox("Follow the live stream")
        self.follow.setChecked(True)
        # What following shows: the newest image the AI has analysed, with its overlay
        # (behind the newest arrival by the AI's latency), or the newest image as it lands
        # (its overlay drawn once ready, if it still shows by then: on a CPU slower than
        # the stream the next image has usually replaced it).
        self.follow_mode = QComboBox()
        for text, mode in FOLLOW_MODES:
            self.follow_mode.addItem(text, mode)
        self.follow_mode.setToolTip("Follow the newest analysed image (with its AI overlay) or the newest image "
                                    "received (fastest, overlay when ready)")
        self.cine_fps = QSpinBox()
        self.cine_fps.setRange(1, 60)
        self.cine_fps.setValue(10)
        self.cine_fps.setSuffix(" fps")
        self.replay_fps = QSpinBox()
        self.replay_fps.setRange(1, 120)
        self.replay_fps.setValue(30)
        self.replay_fps.setSuffix(" fps")
        for w in (self.overlay, self.crops, self.seg, self.follow, self.follow_mode, self.opacity, self.cine_fps, self.replay_fps):
            w.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # keep the hotkeys for the image
        form = QFormLayout(self)
        form.setContentsMargins(4, 4, 4, 4)
        form.addRow(self.overlay)
        form.addRow("Opacity", self.opacity)
        form.addRow(self.crops)
        form.addRow(self.seg)
        form.addRow(self.follow)
        form.addRow("Show", self.follow_mode)
        form.addRow("Cine", self.cine_fps)
        form.addRow("Replay", self.replay_fps)
