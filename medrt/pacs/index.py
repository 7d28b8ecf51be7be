"""The spool's index beyond the work queue: UID checks, what each destination took, and
storage commitment requests.

:class:`~medrt.pacs.spool.Spool` is made of these over its one SQLite connection and
lock (``_db``, ``_lock``): :class:`DeliveryRecords` (per series and destination, the
sha256 of each result file it answered Success to, so a retry sends only what it lacks)
and :class:`CommitmentRecords` (each storage commitment request, kept until its report
is delivered, and the check of what the spool holds). The tables are created with the
spool's schema.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMMITMENT_STATES", "Commitment", "CommitmentRecords", "DeliveryRecords", "SpoolError", "check_uid"]

# PS3.5 9.1 says digits and dots, at most 64; longer ones exist in the wild and are filed, since
# what matters here is a safe file name (no separator, no "..").
_UID = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_UID_MAX = 128

COMMITMENT_STATES = ("pending", "reported", "failed")


class SpoolError(ValueError):
    """An instance the spool cannot file (a missing or malformed UID). The message says which."""


@dataclass(frozen=True, slots=True)
class Commitment:
    """A storage commitment request (PS3.4 J.3): which instances ``calling_ae`` asked us to
    commit to, under ``transaction_uid``; ``refs`` are (SOP Class UID, SOP Instance UID)."""

    transaction_uid: str
    calling_ae: str
    refs: tuple[tuple[str, str], ...]
    state: str  # pending | reported | failed (the report could not be delivered yet: retried)
    received: float
    last_attempt: float
    attempts: int
    detail: str

    @classmethod
    def _from_row(cls, row: tuple) -> Commitment:  # type: ignore[type-arg]
        refs = tuple((str(c), str(i)) for c, i in json.loads(row[2]))
        return cls(row[0], row[1], refs, *row[3:])


# named, not *: a column added to an earlier medrt's index comes last (ALTER TABLE)
_COMMITMENTS = ", ".join(f.name for f in dataclasses.fields(Commitment))


def check_uid(name: str, value: object) -> str:
    """``value`` as a UID string, or :class:`SpoolError` naming the attribute and why."""
    text = str(value or "").strip().rstrip("\x00")
    if not text:
        raise SpoolError(f"no {name}")
    if len(text) > _UID_MAX or not _UID.match(text):
        raise SpoolError(f"{name} is not a valid UID ({len(text)} characters)")
    return text


class _Tables:
    """What the record classes need from the spool they are part of."""

    _db: sqlite3.Connection
    _lock: threading.Lock


class DeliveryRecords(_Tables):
    """The ``deliveries`` table: which result files each destination took, by content."""

    def deliveries(self, series_uid: str, destination: str) -> dict[str, str]:
        """The result files of a series that ``destination`` (``AET@HOST:PORT``) took, by
        name (relative to the series' results folder), with the sha256 of what it took."""
        with self._lock:
            rows = self._db.execute("SELECT name, digest FROM deliveries WHERE series_uid = ? AND destination = ?",
                                    (series_uid, destination)).fetchall()
        return dict(rows)

    def delivery_counts(self) -> dict[str, dict[str, int]]:
        """For each series, how many of its result files each destination took."""
        with self._lock:
            rows = self._db.execute("SELECT series_uid, destination, COUNT(*) FROM deliveries"
                                    " GROUP BY series_uid, destination ORDER BY series_uid, destination").fetchall()
        counts: dict[str, dict[str, int]] = {}
        for uid, dest, n in rows:
            counts.setdefault(uid, {})[dest] = int(n)
        return counts

    def record_deliveries(self, series_uid: str, destination: str, digests: dict[str, str], *,
                          now: float | None = None) -> None:
        """Note that ``destination`` answered Success to each file (name → sha256), so that
        a retry after another destination failed does not send it the same objects twice."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO deliveries (series_uid, destination, name, digest, delivered)"
                                 " VALUES (?, ?, ?, ?, ?)",
                                 [(series_uid, destination, name, digest, now) for name, digest in digests.items()])


class CommitmentRecords(_Tables):
    """The ``commitments`` table, and whether the spool holds what a request names."""

    def add_commitment(self, transaction_uid: str, calling_ae: str, refs: list[tuple[str, str]], *,
                       now: float | None = None) -> None:
        """Record a storage commitment request durably (before the N-ACTION is answered), so
        that its report is sent even after a restart. A transaction UID asked again replaces
        the earlier request and is reported again."""
        transaction_uid = check_uid("Transaction UID", transaction_uid)
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO commitments (transaction_uid, calling_ae, refs, state, received,"
                             " last_attempt, attempts, detail) VALUES (?, ?, ?, 'pending', ?, 0, 0, '')",
                             (transaction_uid, calling_ae, json.dumps(refs), now))

    def commitments_due(self, *, retry_s: float = 60.0, now: float | None = None) -> list[Commitment]:
        """Requests to report now: pending ones, and failed ones last tried ``retry_s`` ago."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(f"SELECT {_COMMITMENTS} FROM commitments WHERE state = 'pending'"
                                    " OR (state = 'failed' AND last_attempt <= ?) ORDER BY received",
                                    (now - retry_s,)).fetchall()
        return [Commitment._from_row(r) for r in rows]

    def all_commitments(self) -> list[Commitment]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_COMMITMENTS} FROM commitments ORDER BY received").fetchall()
        return [Commitment._from_row(r) for r in rows]

    def mark_commitment(self, transaction_uid: str, state: str, detail: str = "", *,
                        now: float | None = None) -> None:
        if state not in COMMITMENT_STATES:
            raise ValueError(f"unknown commitment state {state!r}; expected one of {COMMITMENT_STATES}")
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("UPDATE commitments SET state = ?, detail = ?, last_attempt = ?, attempts = attempts + 1"
                             " WHERE transaction_uid = ?", (state, detail, now, transaction_uid))

    def held(self, refs: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> list[int | None]:
        """For each (SOP Class UID, SOP Instance UID): ``None`` when the spool holds it (indexed,
        and its file on disk at the size it was stored with), else the PS3.3 C.14.1.1
        Failure Reason: 0x0112 no such instance, 0x0119 held under another SOP class."""
        uids = [i for _, i in refs]
        rows: dict[str, tuple[str, str, int]] = {}
        with self._lock:
            for start in range(0, len(uids), 500):  # a study's thousands of images, under SQLite's variable limit
                chunk = uids[start:start + 500]
                rows.update((r[0], (r[1], r[2], r[3])) for r in self._db.execute(
                    f"SELECT sop_uid, sop_class_uid, path, size FROM instances WHERE sop_uid IN"
                    f" ({','.join('?' * len(chunk))})", chunk))
        reasons: list[int | None] = []
        for sop_class, sop in refs:
            row = rows.get(sop)
            if row is None:
                reasons.append(0x0112)
                continue
            held_class, path, size = row
            try:
                on_disk = Path(path).stat().st_size == size
            except OSError:
                on_disk = False
            reasons.append(0x0112 if not on_disk else 0x0119 if held_class and held_class != sop_class else None)
        return reasons
