"""The listener's durable inbox: every received instance on disk before it is acknowledged.

Layout under the spool's root::

    inbox/<SeriesInstanceUID>/<SOPInstanceUID>.dcm   what the peer sent, byte for byte
    index.sqlite3                                    instances and series, with each series' state

:meth:`Spool.store` writes the encoded dataset atomically (a temporary file in the same
folder, fsync'd, renamed, the folder fsync'd: ``medrt.io.atomic``) and commits its row in
the index before it returns, so a C-STORE handler that answers Success only after it
returns never acknowledges an image a power cut could take back.

A series has no "complete" message in DIMSE; like Orthanc's ``StableAge`` and DCMTK's
``--eostudy-timeout``, a series is *due* when nothing new has arrived for it for
``idle_s`` seconds. Its state then moves ``receiving → analysing → analysed →
forwarding → done``. The analysis worker takes ``receiving`` series (and ``failed`` ones:
the analysis raised, retried after ``retry_s``); the forwarder takes ``analysed`` ones
(results written, waiting to be sent) and ``unsent`` ones (a destination did not take
them: sent again after ``retry_s``, not analysed again), so a slow or dead PACS never
holds up the analysis of the next series. A series with nowhere to send its results goes
from ``analysing`` to ``done``. An instance that arrives for a series past ``receiving``
puts it back to ``receiving``: the series is analysed again with it (the batch run
resumes nothing whose content changed).

A spool made with ``min_free_bytes`` refuses an instance that would leave less than that
free on its disk (``OSError`` ENOSPC before anything is written, so the listener answers
0xA700 and the sender keeps the image and retries later), instead of filling the disk
that the index, the results and other services share.

The index also records what each destination took and the storage commitment requests
(:mod:`medrt.pacs.index`, whose record classes :class:`Spool` is made of).

Recovery (:meth:`Spool.recover`, run on open): a series caught mid-analysis goes back to
the queue, one caught mid-forward back to ``analysed`` (its results were whole), files on
disk that the index lacks (a crash between the rename and the commit) are indexed from
their headers, and temporary files of an interrupted write are removed.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medrt.io.atomic import atomic_write_bytes
from medrt.pacs.index import (
    COMMITMENT_STATES,
    Commitment,
    CommitmentRecords,
    DeliveryRecords,
    SpoolError,
    check_uid,
)

__all__ = ["Spool", "SpoolInUseError", "SpoolIndexError", "SCHEMA_VERSION", "SeriesState", "Commitment", "SpoolError",
           "STATES", "COMMITMENT_STATES", "ANALYSIS_QUEUE", "SEND_QUEUE"]

log = logging.getLogger(__name__)

# Modalities of objects a series may hold beside its images (structured reports, key
# objects, presentation states, documents, segmentations, registrations, RT objects).
NON_IMAGE_MODALITIES = ("SR", "KO", "PR", "DOC", "SEG", "REG", "RTSTRUCT", "RTPLAN", "RTRECORD", "RTDOSE")
_NON_IMAGE_SQL = ", ".join(f"'{m}'" for m in NON_IMAGE_MODALITIES)

STATES = ("receiving", "analysing", "analysed", "forwarding", "unsent", "done", "failed")
# Who takes a series in each state from the queue: the analysis worker, or the forwarder.
ANALYSIS_QUEUE = ("receiving", "failed")
SEND_QUEUE = ("analysed", "unsent")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    series_uid TEXT PRIMARY KEY,
    study_uid TEXT NOT NULL,
    modality TEXT NOT NULL DEFAULT '',
    calling_ae TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL,
    instances INTEGER NOT NULL DEFAULT 0,
    first_received REAL NOT NULL,
    last_received REAL NOT NULL,
    last_attempt REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS instances (
    sop_uid TEXT PRIMARY KEY,
    series_uid TEXT NOT NULL,
    sop_class_uid TEXT NOT NULL DEFAULT '',
    transfer_syntax TEXT NOT NULL DEFAULT '',
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    received REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS instances_series ON instances(series_uid);
CREATE TABLE IF NOT EXISTS deliveries (
    series_uid TEXT NOT NULL,
    destination TEXT NOT NULL,
    name TEXT NOT NULL,
    digest TEXT NOT NULL,
    delivered REAL NOT NULL,
    PRIMARY KEY (series_uid, destination, name)
);
CREATE TABLE IF NOT EXISTS commitments (
    transaction_uid TEXT PRIMARY KEY,
    calling_ae TEXT NOT NULL,
    refs TEXT NOT NULL,
    state TEXT NOT NULL,
    received REAL NOT NULL,
    last_attempt REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(frozen=True, slots=True)
class SeriesState:
    series_uid: str
    study_uid: str
    modality: str
    calling_ae: str
    state: str
    instances: int
    first_received: float
    last_received: float
    last_attempt: float
    attempts: int
    detail: str


# named, not *: a column added to an earlier medrt's index comes last (ALTER TABLE)
_SERIES = ", ".join(f.name for f in dataclasses.fields(SeriesState))


class SpoolIndexError(sqlite3.DatabaseError):
    """The spool's index cannot be opened: damaged, not SQLite, or of a newer medrt. The
    message names the file and what to do."""


#: The index's layout version (``PRAGMA user_version``). A later layout bumps it; an index
#: of a later one than this medrt knows is refused (an older medrt would misread it).
SCHEMA_VERSION = 1


def _open_schema(db: sqlite3.Connection, index: Path) -> None:
    """Make ``db`` an index of this medrt's layout: new tables created, and the columns a
    later medrt added to a table given to an index an earlier one made, with their
    defaults (SQLite's ALTER TABLE ADD COLUMN), so an upgraded listener opens the spool it
    ran on (``CREATE TABLE IF NOT EXISTS`` alone leaves an old table as it was, and the
    first query naming a new column failed). Refuses an index of a later layout."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise SpoolIndexError(
            f"{index}: written by a newer medrt (index layout {version}; this medrt knows up to "
            f"{SCHEMA_VERSION}): run that medrt, or a spool of its own for this one")
    wanted = sqlite3.connect(":memory:")
    try:
        wanted.executescript(_SCHEMA)
        tables = [r[0] for r in wanted.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {t: wanted.execute(f"PRAGMA table_info({t})").fetchall() for t in tables}
        objects = {tuple(r) for r in wanted.execute("SELECT type, name FROM sqlite_master")}
    finally:
        wanted.close()
    if version == SCHEMA_VERSION and _up_to_date(db, objects, columns):
        # Nothing to change: no write lock. Every open took one (and wrote user_version), so
        # `medrt spool` beside a listener busy writing waited 5 s and then called a sound
        # index unreadable, telling the operator to move it aside (every series sent again).
        return
    db.execute("BEGIN IMMEDIATE")  # one migration when the listener and `medrt spool` open at once
    try:
        for statement in filter(str.strip, _SCHEMA.split(";")):  # (executescript would commit first)
            db.execute(statement)
        for table, wanted_columns in columns.items():
            have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for _, name, kind, notnull, default, _ in wanted_columns:
                if name in have:
                    continue
                if notnull and default is None:
                    raise SpoolIndexError(f"{index}: table {table} lacks column {name}, which has no default: "
                                          "move the index aside to start it anew")
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"
                           + (" NOT NULL" if notnull else "") + (f" DEFAULT {default}" if default is not None else ""))
                log.info("spool: index %s: column %s.%s added (an index of an earlier medrt)", index.name, table, name)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _up_to_date(db: sqlite3.Connection, objects: set[tuple[str, str]], columns: dict[str, list[Any]]) -> bool:
    """Whether ``db`` already has every table and index of ``_SCHEMA`` (``objects``: (type,
    name)) and every column of its tables (read only: no lock taken)."""
    have = {tuple(r) for r in db.execute("SELECT type, name FROM sqlite_master")}
    if not objects <= have:
        return False
    return all({r[1] for r in wanted} <= {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
               for table, wanted in columns.items())


class SpoolInUseError(RuntimeError):
    """Another process holds the spool (:meth:`Spool.take_ownership`) or the results folder
    (:meth:`Spool.hold_results`); the message names it."""


def hold_folder(folder: Path, rule: str, *, name: str = "listen.lock") -> Any:
    """An exclusive lock on ``folder/name`` (flock, so it goes when the process does, also
    killed), the file naming this process; returns the open file that holds it (None where
    there is no flock: the listener is a Linux service). :class:`SpoolInUseError` names
    the holder and ``rule`` when another process holds it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / name).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise SpoolInUseError(f"{folder} is in use by {holder}: {rule}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"medrt listen, pid {os.getpid()}\n")
    handle.flush()
    return handle


class Spool(DeliveryRecords, CommitmentRecords):
    """A durable inbox of received instances, grouped into series. Thread-safe.

    Several processes may open one spool (the listener, and ``medrt spool`` to look at it
    or requeue a series): the index is SQLite in WAL mode. ``create=False`` opens an
    existing spool only, and raises ``FileNotFoundError`` for a folder that is not one.
    """

    def __init__(self, root: str | Path, *, min_free_bytes: int = 0, create: bool = True) -> None:
        if min_free_bytes < 0:
            raise ValueError(f'Argument "min_free_bytes" must be >= 0, got {min_free_bytes}.')
        self.root = Path(root).resolve()
        if not create and not (self.root / "index.sqlite3").is_file():
            raise FileNotFoundError(errno.ENOENT, "not a medrt spool (no index.sqlite3)", str(self.root))
        self.min_free_bytes = int(min_free_bytes)
        self.inbox = self.root / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._owner: Any = None  # listen.lock, held open while this process owns the spool
        self._results_owner: Any = None  # the results folder's .listen.lock, likewise
        index = self.root / "index.sqlite3"
        try:
            self._db = sqlite3.connect(index, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
            _open_schema(self._db, index)
        except sqlite3.DatabaseError as exc:  # damaged, not SQLite, or written by a newer medrt
            if getattr(self, "_db", None) is not None:
                self._db.close()
            if isinstance(exc, SpoolIndexError):
                raise
            if isinstance(exc, sqlite3.OperationalError):  # locked, read-only, I/O: not the index's fault
                raise SpoolIndexError(
                    f"{index}: cannot be opened now ({exc}): another process may hold it (a listener writing, "
                    "`medrt spool`), or this user may not write the spool folder; try again. The index is not "
                    "reported damaged: do not move it aside") from None
            raise SpoolIndexError(
                f"{index}: not a readable spool index ({exc}). Move it aside to start the index "
                f"anew: the next medrt listen indexes the images left in {self.inbox} from their "
                "headers (their series are analysed, and their results sent, again)") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()
        for held in ("_owner", "_results_owner"):
            if getattr(self, held) is not None:
                getattr(self, held).close()  # (the lock goes with the file)
                setattr(self, held, None)

    def take_ownership(self) -> None:
        """Hold the spool for this process (an exclusive lock on ``listen.lock``, which says
        whose it is): one listener per spool. Call before :meth:`recover`. A second
        ``medrt listen`` on a spool in use (a manual run beside the service, a restart while
        the old one still runs) put the running one's series back to ``receiving`` and
        ``analysed`` as after a crash, and would have analysed and sent them twice; it now
        raises :class:`SpoolInUseError` naming the holder, and changes nothing."""
        self._owner = hold_folder(self.root, "one medrt listen per spool")

    def hold_results(self, out: Path) -> None:
        """Hold the results folder ``out`` too (its ``.listen.lock``): two listeners writing
        one results folder each see only their own spool's series, so one's
        ``--keep-results-days`` would delete the other's results while they wait to be sent.
        :class:`SpoolInUseError` names the holder."""
        self._results_owner = hold_folder(out, "give each medrt listen its own --out", name=".listen.lock")

    def series_dir(self, series_uid: str) -> Path:
        return self.inbox / check_uid("SeriesInstanceUID", series_uid)

    # -- receiving ---------------------------------------------------------------------------------------------

    def store(self, data: bytes, *, study_uid: str, series_uid: str, sop_uid: str, sop_class_uid: str = "",
              transfer_syntax: str = "", modality: str = "", calling_ae: str = "", now: float | None = None) -> Path:
        """Write one instance (its encoded file bytes) durably and index it; returns its path.

        Raises :class:`SpoolError` for a missing or malformed UID (nothing written) and
        ``OSError`` when the disk refuses (nothing indexed; the caller reports a failure).
        """
        study_uid = check_uid("StudyInstanceUID", study_uid)
        series_uid = check_uid("SeriesInstanceUID", series_uid)
        sop_uid = check_uid("SOPInstanceUID", sop_uid)
        self._check_room(len(data))
        path = self.inbox / series_uid / f"{sop_uid}.dcm"
        atomic_write_bytes(path, data)
        self._index(path, len(data), study_uid=study_uid, series_uid=series_uid, sop_uid=sop_uid,
                    sop_class_uid=sop_class_uid, transfer_syntax=transfer_syntax, modality=modality,
                    calling_ae=calling_ae, now=time.time() if now is None else now)
        return path

    def free_bytes(self) -> int:
        """Bytes free on the spool's disk for this process (``statvfs``'s f_bavail)."""
        return shutil.disk_usage(self.root).free

    def _check_room(self, size: int) -> None:
        if not self.min_free_bytes:
            return
        free = self.free_bytes()
        if free - size < self.min_free_bytes:
            raise OSError(errno.ENOSPC, f"spool disk low: {free // 2**20} MiB free, {self.min_free_bytes // 2**20} "
                                        f"MiB kept free (--min-free)", str(self.root))

    def _index(self, path: Path, size: int, *, study_uid: str, series_uid: str, sop_uid: str, sop_class_uid: str,
               transfer_syntax: str, modality: str, calling_ae: str, now: float) -> None:
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT OR REPLACE INTO instances (sop_uid, series_uid, sop_class_uid, transfer_syntax, path,"
                           " size, received) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (sop_uid, series_uid, sop_class_uid, transfer_syntax, str(path), size, now))
                count = db.execute("SELECT COUNT(*) FROM instances WHERE series_uid = ?", (series_uid,)).fetchone()[0]
                db.execute(
                    "INSERT INTO series (series_uid, study_uid, modality, calling_ae, state, instances, first_received,"
                    " last_received) VALUES (?, ?, ?, ?, 'receiving', ?, ?, ?) ON CONFLICT(series_uid) DO UPDATE SET"
                    " state = 'receiving', instances = excluded.instances, last_received = excluded.last_received,"
                    # the images' modality: an SR, KO or PDF filed in the series does not rename it
                    f" modality = CASE WHEN excluded.modality = '' THEN series.modality"
                    f" WHEN series.modality = '' OR series.modality IN ({_NON_IMAGE_SQL}) THEN excluded.modality"
                    " ELSE series.modality END,"
                    " calling_ae = CASE WHEN excluded.calling_ae != '' THEN excluded.calling_ae"
                    " ELSE series.calling_ae END, attempts = 0, detail = ''",
                    (series_uid, study_uid, modality, calling_ae, count, now, now))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    # -- the work queue ------------------------------------------------------------------------------------------

    def due(self, idle_s: float, *, retry_s: float = 60.0, now: float | None = None) -> list[SeriesState]:
        """Series to work on now, oldest first: ``receiving`` ones idle for ``idle_s``, and
        ``failed`` ones whose last attempt is ``retry_s`` old."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SERIES} FROM series WHERE (state = 'receiving' AND last_received <= ?)"
                " OR (state = 'failed' AND last_attempt <= ?) ORDER BY last_received",
                (now - idle_s, now - retry_s)).fetchall()
        return [SeriesState(*r) for r in rows]

    def release_analysing(self, detail: str, *, now: float | None = None) -> int:
        """Series left ``analysing`` by an analysis whose outcome could not be recorded (the
        index's disk was full): ``failed``, tried again after the retry delay. Only for the
        one analysis worker, between analyses (nothing else holds a series ``analysing``)."""
        now = time.time() if now is None else now
        with self._lock:
            cur = self._db.execute("UPDATE series SET state = 'failed', detail = ?, last_attempt = ?"
                                   " WHERE state = 'analysing'", (detail, now))
            return cur.rowcount

    def release_forwarding(self, held: set[str], detail: str, *, now: float | None = None) -> int:
        """Series ``forwarding`` that the one forwarder does not hold (``held``: those in its
        lanes) lost their outcome: ``unsent``, sent again after the retry delay."""
        now = time.time() if now is None else now
        with self._lock:
            rows = [r[0] for r in self._db.execute("SELECT series_uid FROM series WHERE state = 'forwarding'")]
            lost = [uid for uid in rows if uid not in held]
            for uid in lost:
                self._db.execute("UPDATE series SET state = 'unsent', detail = ?, last_attempt = ?"
                                 " WHERE series_uid = ? AND state = 'forwarding'", (detail, now, uid))
            return len(lost)

    def claim(self, series_uid: str, *, expect_received: float, now: float | None = None) -> bool:
        """Move a due series to ``analysing``, unless an instance arrived since it was listed."""
        return self._claim(series_uid, "analysing", ANALYSIS_QUEUE, expect_received, now)

    def to_send(self, *, retry_s: float = 60.0, now: float | None = None) -> list[SeriesState]:
        """Series whose results to send now, oldest first: ``analysed`` ones, and ``unsent``
        ones whose last attempt is ``retry_s`` old."""
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_SERIES} FROM series WHERE state = 'analysed' OR (state = 'unsent' AND last_attempt <= ?)"
                " ORDER BY last_received", (now - retry_s,)).fetchall()
        return [SeriesState(*r) for r in rows]

    def claim_send(self, series_uid: str, *, expect_received: float, now: float | None = None) -> bool:
        """Move an ``analysed`` or ``unsent`` series to ``forwarding``, unless an instance
        arrived since it was listed (it is ``receiving`` again, to be analysed first). The
        reason it was ``unsent`` stays until the send ends."""
        return self._claim(series_uid, "forwarding", SEND_QUEUE, expect_received, now, keep_detail=True)

    def _claim(self, series_uid: str, to: str, states: tuple[str, str], expect_received: float,
               now: float | None, *, keep_detail: bool = False) -> bool:
        """One worker's claim: ``states`` → ``to`` in one UPDATE, which only one claimant
        can win, and none once an instance arrived after ``expect_received``."""
        now = time.time() if now is None else now
        detail = "" if keep_detail else ", detail = ''"
        with self._lock:
            cur = self._db.execute(
                f"UPDATE series SET state = ?, last_attempt = ?, attempts = attempts + 1{detail}"
                " WHERE series_uid = ? AND state IN (?, ?) AND last_received = ?",
                (to, now, series_uid, *states, expect_received))
            return cur.rowcount == 1

    def mark(self, series_uid: str, state: str, detail: str = "", *, unless_received_after: float | None = None,
             attempted_at: float | None = None) -> bool:
        """Set a series' state. With ``unless_received_after``, leave a series that received
        an instance after that time alone (it is ``receiving`` again and will be redone).
        ``attempted_at`` moves its last attempt (what retries count from) to that time."""
        if state not in STATES:
            raise ValueError(f"unknown series state {state!r}; expected one of {STATES}")
        attempt = ", last_attempt = ?" if attempted_at is not None else ""
        at = (attempted_at,) if attempted_at is not None else ()
        with self._lock:
            if unless_received_after is None:
                cur = self._db.execute(f"UPDATE series SET state = ?, detail = ?{attempt} WHERE series_uid = ?",
                                       (state, detail, *at, series_uid))
            else:
                cur = self._db.execute(
                    f"UPDATE series SET state = ?, detail = ?{attempt} WHERE series_uid = ? AND last_received <= ?"
                    " AND state != 'receiving'", (state, detail, *at, series_uid, unless_received_after))
            return cur.rowcount == 1

    def requeue(self, series_uid: str) -> str:
        """Put a series that is not being worked on (``done``, ``failed``, ``unsent``, or
        waiting) back in the queue now (an operator's "do it again": after a PACS lost the
        results, or once the cause of a failure is fixed).

        The worker takes it at its next pass: what is unchanged (same images, models and
        settings) is resumed, not analysed again, and the results are forwarded again.
        Returns the state it was in. Raises ``KeyError`` for a series the spool does not
        hold (never received, or purged) and ``ValueError`` for one being analysed or
        forwarded right now.
        """
        with self._lock:
            row = self._db.execute("SELECT state FROM series WHERE series_uid = ?", (series_uid,)).fetchone()
            if row is None:
                raise KeyError(series_uid)
            if row[0] in ("analysing", "forwarding"):
                raise ValueError(f"series {series_uid} is {row[0]} now")
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("UPDATE series SET state = 'receiving', last_attempt = 0, attempts = 0,"
                             " detail = 'requeued by hand' WHERE series_uid = ?", (series_uid,))
            self._db.execute("DELETE FROM deliveries WHERE series_uid = ?", (series_uid,))  # "send them again"
            self._db.execute("COMMIT")
            return str(row[0])

    def totals(self) -> dict[str, int]:
        """Series per state, with ``instances`` and ``bytes`` held in the inbox."""
        with self._lock:
            counts = dict.fromkeys(STATES, 0)
            counts.update(self._db.execute("SELECT state, COUNT(*) FROM series GROUP BY state").fetchall())
            n, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM instances").fetchone()
            reports = dict(self._db.execute("SELECT state, COUNT(*) FROM commitments GROUP BY state").fetchall())
        return {**counts, "instances": int(n), "bytes": int(size),
                **{f"commitments_{k}": int(reports.get(k, 0)) for k in COMMITMENT_STATES}}

    def oldest_unfinished(self) -> float | None:
        """When the first image of the oldest series not done yet came (None: all done)."""
        with self._lock:
            (value,) = self._db.execute("SELECT MIN(first_received) FROM series WHERE state != 'done'").fetchone()
        return None if value is None else float(value)

    def series(self, series_uid: str) -> SeriesState | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_SERIES} FROM series WHERE series_uid = ?", (series_uid,)).fetchone()
        return None if row is None else SeriesState(*row)

    def all_series(self) -> list[SeriesState]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_SERIES} FROM series ORDER BY first_received").fetchall()
        return [SeriesState(*r) for r in rows]

    def paths(self, series_uid: str) -> list[Path]:
        with self._lock:
            rows = self._db.execute("SELECT path FROM instances WHERE series_uid = ? ORDER BY received",
                                    (series_uid,)).fetchall()
        return [Path(r[0]) for r in rows]

    def purge(self, older_than_s: float, *, now: float | None = None) -> list[str]:
        """Delete the received images of ``done`` series whose last image is older than
        ``older_than_s`` (their results stay in the results folder); returns their UIDs.

        A series that is not done (waiting, failed, being analysed) is never purged.
        Storage commitment requests that old go too: reported ones, and those whose report
        no one took in all that time (logged as given up).
        """
        now = time.time() if now is None else now
        with self._lock:
            uids = [r[0] for r in self._db.execute(
                "SELECT series_uid FROM series WHERE state = 'done' AND last_received < ?", (now - older_than_s,))]
        purged = []
        for uid in uids:
            with self._lock:  # one at a time: an image arriving for it meanwhile makes it 'receiving' again
                row = self._db.execute("SELECT state, last_received FROM series WHERE series_uid = ?", (uid,)).fetchone()
                if row is None or row[0] != "done" or row[1] >= now - older_than_s:
                    continue
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("DELETE FROM instances WHERE series_uid = ?", (uid,))
                self._db.execute("DELETE FROM series WHERE series_uid = ?", (uid,))
                self._db.execute("DELETE FROM deliveries WHERE series_uid = ?", (uid,))
                self._db.execute("COMMIT")
                shutil.rmtree(self.inbox / uid, ignore_errors=True)
            purged.append(uid)
        with self._lock:  # commitment requests as old: reported ones, and reports no one took for that long
            gone = self._db.execute("SELECT transaction_uid, calling_ae FROM commitments WHERE state != 'reported'"
                                    " AND received < ?", (now - older_than_s,)).fetchall()
            self._db.execute("DELETE FROM commitments WHERE received < ?", (now - older_than_s,))
        for transaction, calling in gone:
            log.warning("spool: storage commitment report %s for %s never delivered in %.1f day(s); given up",
                        transaction, calling, older_than_s / 86400)
        if purged:
            log.info("spool: purged the images of %d series done over %.1f day(s) ago", len(purged),
                     older_than_s / 86400)
        return purged

    # -- recovery ------------------------------------------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Make the index agree with the disk after a crash; returns what it did, by kind."""
        import pydicom

        done = {"requeued": 0, "indexed": 0, "unreadable": 0, "temporaries": 0}
        with self._lock:
            # A series still receiving when the listener stopped: no sender could reach it
            # while it was down, so the quiet time (--idle) starts again now. It used to
            # count the downtime, and half a series was analysed and its results sent at
            # once, before the sender could send the rest.
            now = time.time()
            self._db.execute("UPDATE series SET last_received = ? WHERE state = 'receiving' AND last_received < ?",
                             (now, now))
            cur = self._db.execute("UPDATE series SET state = 'receiving', detail = 'resumed after a restart'"
                                   " WHERE state = 'analysing'")
            done["requeued"] = cur.rowcount
            # Results are written before a series is 'analysed', so one caught sending has them whole.
            cur = self._db.execute("UPDATE series SET state = 'analysed', detail = 'sent again after a restart'"
                                   " WHERE state = 'forwarding'")
            done["requeued"] += cur.rowcount
            known = {r[0] for r in self._db.execute("SELECT path FROM instances")}
        for tmp in self.inbox.glob("*/.*.tmp"):  # an atomic write that never finished: never acknowledged
            tmp.unlink(missing_ok=True)
            done["temporaries"] += 1
        for path in sorted(self.inbox.glob("*/*.dcm")):
            if str(path) in known:
                continue
            try:
                ds = pydicom.dcmread(path, stop_before_pixels=True)
                self._index(path, path.stat().st_size, study_uid=check_uid("StudyInstanceUID", ds.get("StudyInstanceUID")),
                            series_uid=check_uid("SeriesInstanceUID", ds.get("SeriesInstanceUID")),
                            sop_uid=check_uid("SOPInstanceUID", ds.get("SOPInstanceUID")),
                            sop_class_uid=str(ds.get("SOPClassUID", "")),
                            transfer_syntax=str(ds.file_meta.get("TransferSyntaxUID", "")),
                            modality=str(ds.get("Modality", "")), calling_ae="", now=path.stat().st_mtime)
                done["indexed"] += 1
            except Exception as exc:  # noqa: BLE001 - a file we cannot index stays where it is, named in the log
                log.error("spool: %s: cannot index (%s: %s); left in place", path.name, type(exc).__name__, exc)
                done["unreadable"] += 1
        if any(done.values()):
            log.info("spool: recovered %s", ", ".join(f"{v} {k}" for k, v in done.items() if v))
        return done
