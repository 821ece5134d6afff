"""The outbox's integrity, checked before the notifier opens it, and the ledger of what it acknowledged.

SQLite cannot tell a database that lost its write-ahead log from a complete one: after a SIGKILL the
commits since the last checkpoint live only in `<outbox>-wal`, and a backup or volume move that copies the
main file alone, a deleted or cut `-wal`, or a truncated main file, leaves a database that opens, passes
`PRAGMA quick_check` and simply lacks the newest acknowledged webhooks. So the outbox keeps a ledger beside
it, `<outbox>.acked`: the highest message and delivery ids it answered 2xx for, rewritten in place after
every intake commit (one `pwrite` of a fixed-width line, no fsync: it is written after the commit's fsync,
so it is never ahead of what the database holds on disk, and it survives a killed process; after a power
loss it can only be behind, which hides a loss but never invents one).

`check()` (at start) compares the database with the ledger and runs `PRAGMA quick_check`; a damaged or
missing outbox is an `OutboxDamaged` error whose one line names what is missing and how to recover. With
`--move-damaged-outbox` the files are moved aside (`<file>.damaged-<UTC time>`) and the notifier starts
empty, recording in the new outbox how many acknowledged webhooks were lost and when
(`inferwatch_notifier_outbox_lost_webhooks`, `inferwatch_notifier_outbox_damaged_timestamp_seconds`, alert
`NotifierOutboxDamaged`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from inferwatch.errors import UsageError

OUTBOX_FILE = "outbox.sqlite3"  # the outbox database in the notifier's data folder
LEDGER_SUFFIX = ".acked"
SIDE_FILES = ("-wal", "-shm", LEDGER_SUFFIX)  # moved aside with the database
_LEDGER_WIDTH = 64
_LEDGER = re.compile(rb"messages=(\d+) deliveries=(\d+) *\n")  # the whole fixed-width line, nothing else
MOVE_FLAG = "--move-damaged-outbox"


class OutboxDamaged(UsageError):
    """The outbox is damaged or incomplete: the notifier refuses to start (exit 2) with this one line."""


@dataclasses.dataclass(frozen=True)
class Damage:
    """What is wrong with an outbox: `what` (one clause), `lost` acknowledged webhooks known lost (None:
    unknown, e.g. an unreadable file without a ledger)."""

    what: str
    lost: int | None


def ledger_path(db: Path) -> Path:
    return db.with_name(db.name + LEDGER_SUFFIX)


class LedgerUnreadable(OSError):
    """The ledger file exists but cannot be read or is not one whole ledger line (cut, overwritten, random)."""


def read_ledger(db: Path) -> tuple[int, int] | None:
    """(messages, deliveries) the ledger beside `db` records as acknowledged; None when there is no ledger file.

    Raises LedgerUnreadable when the file exists but cannot be read, or is not exactly one line as `Ledger`
    writes it (64 bytes): a cut line could otherwise read as lower counts ("deliveries=2" of "=20") and hide a
    loss.
    """
    path = ledger_path(db)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerUnreadable(f"its ledger {path.name} cannot be read ({exc.strerror or exc})") from None
    m = _LEDGER.fullmatch(data) if len(data) == _LEDGER_WIDTH else None
    if m is None:
        raise LedgerUnreadable(f"its ledger {path.name} is not a ledger line ({len(data)} bytes; cut short or "
                               "overwritten)")
    return int(m.group(1)), int(m.group(2))


class Ledger:
    """The `<outbox>.acked` file of one outbox, kept open; `advance()` after each intake commit."""

    def __init__(self, db: Path):
        """Open (or create) the ledger of `db`. The service creates it before the database, so an outbox
        database without a ledger beside it is a copy that left the ledger behind (`check()`). Raises
        LedgerUnreadable (an OSError) for a ledger that is present but unreadable."""
        self.path = ledger_path(db)
        known = read_ledger(db)
        self.messages, self.deliveries = known or (0, 0)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._write()
        if known is None:
            # Once, when created: a power loss must not leave an empty ledger (read as damage); the later
            # rewrites of this one block need no fsync (see the module docstring).
            os.fsync(self._fd)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def advance(self, messages: int | None, deliveries: int | None) -> None:
        """Record the highest ids now committed (never lowers them: a row pruned later stays counted)."""
        m, d = max(self.messages, messages or 0), max(self.deliveries, deliveries or 0)
        if (m, d) != (self.messages, self.deliveries):
            self.messages, self.deliveries = m, d
            self._write()

    def _write(self) -> None:
        line = f"messages={self.messages} deliveries={self.deliveries}".encode().ljust(_LEDGER_WIDTH - 1) + b"\n"
        os.pwrite(self._fd, line, 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def highest_ids(db: sqlite3.Connection) -> tuple[int, int]:
    """(highest message id, highest delivery id ever assigned) of an open outbox; 0 for an empty one."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    m = db.execute("SELECT MAX(id) FROM messages").fetchone()[0] if "messages" in tables else None
    d = None
    if "sqlite_sequence" in tables:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name='deliveries'").fetchone()
        d = row[0] if row else None
    return int(m or 0), int(d or 0)


def check(db: Path) -> Damage | None:
    """Is the outbox at `db` whole? None when it is, or when there is none and never was one (no database,
    no `-wal`, no ledger, or a ledger that records nothing acknowledged).

    Damage when: the database is missing while its ledger (recording acknowledged webhooks) or `-wal` exists;
    the database exists without its ledger (the service writes the ledger before it creates the database, so
    this is a copy or move that left it behind; lost: unknown); the ledger is unreadable or not a whole ledger
    line (lost: unknown); the database cannot be opened or read (permissions, not a database); `PRAGMA
    quick_check` fails; it holds fewer messages or deliveries than the ledger says were acknowledged (a
    missing, cut or stale `-wal`, or a truncated file).

    Read-only: the files are left exactly as found (no `-wal` or `-shm` created, no checkpoint), so a second
    start reports the same damage and whoever restores or inspects the files sees what was there.
    """
    wal = db.with_name(db.name + "-wal")
    ledger = ledger_path(db)
    try:
        acked = read_ledger(db)
    except LedgerUnreadable as exc:
        return Damage(f"the outbox {db} cannot be checked: {exc}, so the acknowledged webhooks it should hold "
                      "are unknown", None)
    wal_exists = wal.exists()
    if not db.exists():
        if acked and acked[0]:
            return Damage(f"the outbox database {db} is missing while its ledger {ledger.name} records "
                          f"{acked[0]} acknowledged webhook(s)", acked[0])
        if wal_exists:
            return Damage(f"the outbox database {db} is missing while its write-ahead log {wal.name} exists",
                          acked[0] if acked else None)
        return None
    if acked is None:
        return Damage(f"the outbox {db} has no ledger {ledger.name} beside it, so the acknowledged webhooks it "
                      "should hold are unknown (a copy or move of the database without it?)", None)
    if not os.access(db, os.R_OK | os.W_OK):
        return Damage(f"the outbox database {db} cannot be read and written by this user (uid {os.getuid()})",
                      acked[0])
    try:
        have, problem = _inspect(db, wal if wal_exists else None)
    except (sqlite3.Error, OSError) as exc:
        return Damage(f"the outbox database {db} cannot be read ({exc})", acked[0])
    if problem is not None:
        return Damage(f"the outbox database {db} fails SQLite's integrity check ({problem[:200]})", acked[0])
    if have[0] >= acked[0] and have[1] >= acked[1]:
        return None
    lost = max(acked[0] - have[0], 0)
    why = (f"its write-ahead log {wal.name} is missing (a copy or move of the main file alone?)" if not wal_exists
           else f"its write-ahead log {wal.name} or the database was cut short")
    return Damage(f"the outbox {db} lacks {lost} acknowledged webhook(s) and {max(acked[1] - have[1], 0)} "
                  f"delivery row(s) its ledger records: {why}", lost)


def _inspect(db: Path, wal: Path | None) -> tuple[tuple[int, int], str | None]:
    """((highest message id, highest delivery id), None or what `PRAGMA quick_check` reported) of the outbox,
    without changing its files. Raises sqlite3.Error or OSError when it cannot be read.

    SQLite's `mode=ro` still creates an empty `-wal` and a `-shm` in a writable directory, so: without a
    `-wal` the main file is opened `immutable=1` (nothing else to read, nothing created); with one, the main
    file and its `-wal` are copied to a temporary directory and the copy is read (the outbox is small: pruned
    after the dedup window; read in place when the copy cannot be made)."""
    def read(conn: sqlite3.Connection) -> tuple[tuple[int, int], str | None]:
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check(3)")]
            if rows != ["ok"]:
                return (0, 0), "; ".join(rows)
            return highest_ids(conn), None
        finally:
            conn.close()

    if wal is None:
        return read(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro&immutable=1", uri=True))
    try:
        with tempfile.TemporaryDirectory(prefix="inferwatch-outbox-check-") as tmp:
            copy = Path(tmp) / db.name
            shutil.copyfile(db, copy)
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            return read(sqlite3.connect(copy, timeout=30.0))
    except OSError:
        # No room for the copy (a full temporary directory): read the files in place. With the -wal there
        # this can only add a missing -shm, an index SQLite rebuilds, not the damage the message names.
        return read(sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0))


def check_data_dir(path: Path, move_damaged: bool) -> Damage | None:
    """The start-up checks of the outbox `path` in its data folder, before anything is opened: the folder is
    created and must be writable (UsageError), then `check(path)`: its Damage, which raises OutboxDamaged
    (refusal()) unless `move_damaged`; None for a whole or fresh outbox. Imports nothing heavy, so the CLI
    refuses a damaged outbox before loading the service (aiohttp, the channels)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use --data-dir {path.parent}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot use --data-dir {path.parent}: not writable (a read-only file system or "
                         "wrong owner); the outbox needs to create its files there")
    damage = check(path)
    if damage is not None and not move_damaged:
        raise refusal(damage)
    return damage


def refusal(damage: Damage) -> OutboxDamaged:
    """The one line the notifier exits with: what is missing and the two ways on."""
    return OutboxDamaged(f"{damage.what}; restore the outbox files (database, -wal, .acked) together from where "
                         f"they came, or start with {MOVE_FLAG} to move them aside and start empty (the loss is "
                         "recorded in inferwatch_notifier_outbox_lost_webhooks)")


def move_aside(db: Path, now: float | None = None) -> list[Path]:
    """Rename the outbox and its side files to `<name>.damaged-<UTC time>`; returns the new paths."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    moved = []
    for path in (db, *(db.with_name(db.name + s) for s in SIDE_FILES)):
        if path.exists():
            target = path.with_name(f"{path.name}.damaged-{stamp}")
            path.rename(target)
            moved.append(target)
    return moved


def record_loss(conn: sqlite3.Connection, damage: Damage, now: float) -> None:
    """Write into a fresh outbox's meta table that acknowledged webhooks were lost (read by `loss()`)."""
    with conn:
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('damaged_at', ?)", (repr(now),))
        if damage.lost is not None:
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('lost_webhooks', ?)", (str(damage.lost),))


def loss(conn: sqlite3.Connection) -> tuple[float | None, int | None]:
    """(when a damaged outbox was moved aside, acknowledged webhooks lost then): None each when unknown."""
    rows = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('damaged_at', 'lost_webhooks')").fetchall())
    at = float(rows["damaged_at"]) if "damaged_at" in rows else None
    lost = int(rows["lost_webhooks"]) if "lost_webhooks" in rows else None
    return at, lost


class LossCollector:
    """prometheus-client collector of the outbox's recorded loss (read once: it only changes at start).

    inferwatch_notifier_outbox_damaged_timestamp_seconds: when a damaged outbox was last moved aside (no
    sample if never); inferwatch_notifier_outbox_lost_webhooks: acknowledged webhooks lost then (no sample
    when unknown or never)."""

    def __init__(self, conn: sqlite3.Connection):
        self.at, self.lost = loss(conn)

    def describe(self):
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily("inferwatch_notifier_outbox_damaged_timestamp_seconds", ""),
                GaugeMetricFamily("inferwatch_notifier_outbox_lost_webhooks", "")]

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        at = GaugeMetricFamily("inferwatch_notifier_outbox_damaged_timestamp_seconds",
                               "When a damaged or incomplete outbox was moved aside (--move-damaged-outbox), "
                               "Unix seconds; no sample if never.")
        if self.at is not None:
            at.add_metric([], self.at)
        yield at
        lost = GaugeMetricFamily("inferwatch_notifier_outbox_lost_webhooks",
                                 "Acknowledged webhooks the moved-aside outbox lacked (its ledger's count); no "
                                 "sample when unknown.")
        if self.lost is not None:
            lost.add_metric([], self.lost)
        yield lost
