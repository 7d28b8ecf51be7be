"""Who and what is on screen: the patient and study of a series, for the HUD and the browser.

A reader confirms whose images these are before reading them, and a disc or a watched
folder can hold several patients, so the viewer shows the patient and study of the
series on screen (top left, as cornerstone/OHIF do) and warns when the open images
belong to more than one patient. ``p`` hides the details for a shared screen or a
screenshot. Nothing here is logged: logs name images by UID only (``medrt.privacy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydicom.valuerep import PersonName

__all__ = ["PatientInfo", "patients_text"]


@dataclass(frozen=True, slots=True)
class PatientInfo:
    name: str
    patient_id: str
    sex: str
    birth_date: str
    study_date: str
    study_description: str
    accession: str

    @classmethod
    def of(cls, ds: Any) -> PatientInfo | None:
        """The patient and study of a header; None without one. A value pydicom cannot
        read is left out rather than stopping the viewer."""
        if ds is None:
            return None

        def text(keyword: str) -> str:
            try:
                return str(ds.get(keyword, "") or "").strip()
            except Exception:  # a damaged value
                return ""

        try:
            name = _person_name(ds.get("PatientName"))
        except Exception:
            name = ""
        return cls(name, text("PatientID"), text("PatientSex"), _date(text("PatientBirthDate")),
                   _date(text("StudyDate")), text("StudyDescription"), text("AccessionNumber"))

    @property
    def identity(self) -> tuple[str, str]:
        """What tells two patients apart here: (ID, name)."""
        return self.patient_id, self.name

    def hud_text(self) -> str:
        """Two lines: the patient, then the study."""
        who = [self.name or "(no name)"]
        if self.patient_id:
            who.append(f"ID {self.patient_id}")
        if self.sex:
            who.append(self.sex)
        if self.birth_date:
            who.append(f"born {self.birth_date}")
        study = [v for v in (self.study_date, self.study_description) if v]
        if self.accession:
            study.append(f"Acc {self.accession}")
        return " · ".join(who) + ("\n" + " · ".join(study) if study else "")


def patients_text(infos: list[PatientInfo | None]) -> str:
    """A warning for the browser when the open images belong to more than one patient."""
    ids = {i.identity for i in infos if i is not None}
    return f"⚠ images of {len(ids)} patients are open" if len(ids) > 1 else ""


def _person_name(value: Any) -> str:
    """``DOE^JOHN^A`` as ``DOE, JOHN A``."""
    if not value:
        return ""
    pn = value if isinstance(value, PersonName) else PersonName(str(value))
    given = " ".join(p for p in (pn.given_name, pn.middle_name) if p)
    family = pn.family_name or ""
    return f"{family}, {given}" if family and given else (family or given or str(value)).strip()


def _date(value: str) -> str:
    """A DICOM date (``YYYYMMDD``) as ``YYYY-MM-DD``; anything else as it is."""
    v = value.strip()
    return f"{v[:4]}-{v[4:6]}-{v[6:8]}" if len(v) == 8 and v.isdigit() else v
