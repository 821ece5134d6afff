"""Durable outbox: SQLite in WAL mode with synchronous=FULL, so a webhook acknowledged with 2xx is on disk.

Tables: `intake` (delivery keys of recent webhooks, for redelivery detection), `messages` (webhook bodies),
`deliveries` (one row per message × channel: pending → delivered | dead | superseded | cancelled).
Every state change is one transaction, so a process killed at any instant (SIGKILL mid-delivery included)
leaves each row either pending (sent again after restart: at-least-once) or finished.
Each thread gets its own connection (sqlite3 connections are not shared across threads).

Writes can fail (disk full: SQLITE_FULL; a failing disk: SQLITE_IOERR; a read-only file). The outbox keeps
the condition (`write_error`, counted per operation in `write_errors`), logs it once when it starts and once
when it ends, and answers `writable`; `probe()` tries a tiny write to learn whether it has ended.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from inferwatch.notifier import integrity
from inferwatch.notifier.model import WebhookMessage, message_from_dict, parse_time
from inferwatch.redaction import redact

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS intake (key TEXT PRIMARY KEY, received_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, body TEXT NOT NULL, received_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id INTEGER NOT NULL REFERENCES messages(id),
    channel TEXT NOT NULL,
    kind TEXT NOT NULL,               -- notify | escalation
    group_key TEXT NOT NULL,
    status TEXT NOT NULL,             -- firing | resolved (of the message)
    route INTEGER NOT NULL,
    alerts INTEGER NOT NULL,          -- alerts the message accounts for (truncated ones included)
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    finished_at REAL,
    last_reason TEXT NOT NULL DEFAULT '',
    last_error TEXT NOT NULL DEFAULT '',
    requeued_at REAL                  -- set by `outbox retry`: max_delivery_age counts from here, not created_at
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries(state, channel, next_attempt_at);
CREATE INDEX IF NOT EXISTS deliveries_group ON deliveries(group_key, state);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);  -- probe() writes here
-- Alerts reported resolved (per group and fingerprint, the latest endsAt), kept for the dedup window: a
-- firing notification about an alert instance already reported resolved is stale (stale.py).
CREATE TABLE IF NOT EXISTS resolutions (group_key TEXT NOT NULL, fingerprint TEXT NOT NULL, ends_at REAL NOT NULL,
                                        received_at REAL NOT NULL, PRIMARY KEY (group_key, fingerprint));
"""

STATES = ("pending", "delivered", "dead", "superseded", "cancelled")
SQLITE_INT_MAX = 2**63 - 1  # INTEGER columns are signed 64-bit; Alertmanager's truncatedAlerts is a uint64
WRITE_OPERATIONS = ("intake", "record", "probe")  # what a failed write was doing (write_errors keys)


class OutboxError(RuntimeError):
    """The outbox could not persist (disk full, read-only, corrupt): the intake answers 5xx."""


@dataclasses.dataclass(frozen=True)
class Planned:
    """A delivery the router decided on: channel, kind (notify|escalation), route index, earliest send time."""

    channel: str
    kind: str
    route: int
    not_before: float
    dead_reason: str = ""  # set: stored already dead with this reason (an unrouted alert no channel can take)


@dataclasses.dataclass
class Delivery:
    id: int
    message_id: int
    channel: str
    kind: str
    group_key: str
    status: str
    route: int
    alerts: int
    state: str
    attempts: int
    created_at: float
    next_attempt_at: float
    finished_at: float | None
    last_reason: str
    last_error: str
    requeued_at: float | None = None

    @property
    def age_origin(self) -> float:
        """When this delivery's max_delivery_age started: created, or last put back by `outbox retry`."""
        return self.requeued_at or self.created_at


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of some deliveries, to be written by Outbox.record: a final `state` (delivered, dead,
    superseded, cancelled) at `at`, or "pending" with `schedule` = (id, next attempt time) for a retry."""

    ids: tuple[int, ...]
    state: str
    at: float = 0.0
    reason: str = ""
    error: str = ""
    schedule: tuple[tuple[int, float], ...] = ()

    @classmethod
    def finished(cls, ids, state: str, at: float, reason: str = "", error: str = "") -> "Outcome":
        if state not in STATES or state == "pending":
            raise ValueError(f"not a final state: {state!r}")
        return cls(tuple(ids), state, at, reason, error)

    @classmethod
    def retry(cls, schedule, reason: str, error: str) -> "Outcome":
        schedule = tuple(schedule)
        return cls(tuple(i for i, _ in schedule), "pending", 0.0, reason, error, schedule)


class AlreadyDelivered(RuntimeError):
    """`retry` of a delivered row without force=True; `.delivery` is the row (finished_at = when)."""

    def __init__(self, delivery: "Delivery"):
        super().__init__(f"delivery {delivery.id} was already delivered")
        self.delivery = delivery


class Outbox:
    def __init__(self, path: str | Path, *, dedup_window_s: float = 1800.0, ledger: bool = False):
        """`ledger`: keep `<path>.acked` up to date after every intake commit (the service; integrity.py)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.dedup_window_s = dedup_window_s
        self._local = threading.local()
        # Every thread's open connection, so that close_all() can close them: a sqlite3 connection refers to
        # itself (its statement cache), so one left open is freed only by the garbage collector, with its
        # three open files (database, -wal, -shm), even after its thread ended.
        self._open: set[sqlite3.Connection] = set()
        self._open_lock = threading.Lock()
        # The ledger before the database: a database without one is then always a copy that left it behind.
        self.ledger = integrity.Ledger(self.path) if ledger else None
        self._db().executescript(SCHEMA)  # idempotent; executescript manages its own transaction
        # Columns an outbox written by an older version lacks.
        self._add_column("deliveries", "requeued_at", "REAL")
        self._add_column("messages", "delivery_key", "TEXT")
        self._db().execute("CREATE INDEX IF NOT EXISTS messages_key ON messages(delivery_key)")
        self._last_prune = 0.0
        self.write_error: str | None = None   # set while writes fail (the last error), None when writable
        self.write_errors: Counter = Counter({op: 0 for op in WRITE_OPERATIONS})
        self._state_lock = threading.Lock()
        self._on_writable: list[Callable[[], None]] = []
        if self.ledger is not None:
            self.ledger.advance(*integrity.highest_ids(self._db()))

    def _add_column(self, table: str, column: str, kind: str) -> None:
        if column in {r["name"] for r in self._db().execute(f"PRAGMA table_info({table})")}:
            return
        try:
            self._db().execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.OperationalError as exc:  # another process (the CLI, the service) added it first
            if "duplicate column" not in str(exc):
                raise

    # ---------------------------------------------------------------------------------- write state
    @property
    def writable(self) -> bool:
        return self.write_error is None

    def _write(self, operation: str, fn: Callable[[sqlite3.Connection], object]):
        """Run `fn(db)` in one transaction; track the outbox's write state. Raises OutboxError."""
        highest = None
        try:
            with self._tx() as db:
                result = fn(db)
                if operation == "intake" and self.ledger is not None:
                    highest = integrity.highest_ids(db)
        except sqlite3.Error as exc:
            self._failed(operation, exc)
            raise OutboxError(f"outbox write failed: {exc}") from exc
        if highest is not None and self.ledger is not None:
            # After the commit (fsynced): the ledger is never ahead of the database.
            self.ledger.advance(*highest)
        self._succeeded()
        return result

    def _failed(self, operation: str, exc: sqlite3.Error) -> None:
        with self._state_lock:
            self.write_errors[operation] += 1
            started = self.write_error is None
            self.write_error = str(exc)
        if started:
            log.error("the outbox %s cannot be written (%s): webhooks are answered 503 so Alertmanager retries, "
                      "notifications sent meanwhile are held in memory and not sent again, /-/ready answers "
                      "503; free space or fix the disk", self.path, exc)

    def _succeeded(self) -> None:
        if self.write_error is None:
            return
        with self._state_lock:
            ended, self.write_error = self.write_error is not None, None
        if ended:
            log.warning("the outbox %s can be written again", self.path)
            for callback in self._on_writable:
                callback()

    def on_writable(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever a write succeeds after failures (e.g. to retry held writes at once)."""
        self._on_writable.append(callback)

    def probe(self, size: int = 0) -> bool:
        """Try a one-row write of `size` bytes (a webhook's size: a token write fits where a webhook does not, in
        the WAL's reused frames or a filesystem's last blocks); True when the outbox can be written (and the
        write state says so). The row is replaced by the next probe, so it costs at most `size` bytes."""
        try:
            self._write("probe", lambda db: db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES "
                                                       "('probe', ? || hex(randomblob(?)))",
                                                       (str(time.time()), max(size, 0) // 2)))
        except OutboxError:
            return False
        return True

    # ---------------------------------------------------------------------------------- connections
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None or db not in self._open:  # none yet, or closed by close_all()
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: the commit is fsynced before we answer 2xx; NORMAL could lose the last commits on power loss.
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            self._local.db = db
            with self._open_lock:
                self._open.add(db)
        return db

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                try:
                    self.db.execute("COMMIT")
                    return False
                except sqlite3.Error:
                    self._rollback()
                    raise
            self._rollback()
            return False

        def _rollback(self) -> None:
            # SQLite may already have rolled back itself (SQLITE_FULL/IOERR during a write): ROLLBACK would
            # then raise "no transaction is active" and hide the real error.
            if self.db.in_transaction:
                try:
                    self.db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass

    def _tx(self) -> "_Tx":
        return self._Tx(self._db())

    def close(self) -> None:
        """Close the calling thread's connection (each thread that used the outbox, when it ends)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            with self._open_lock:
                self._open.discard(db)
            db.close()

    def close_all(self) -> None:
        """Close every thread's connection and the ledger, once no thread uses the outbox any more (the
        service's stop): a stopped notifier holds none of the data folder's files. A later use opens a new
        connection; the ledger stays closed."""
        with self._open_lock:
            conns, self._open = list(self._open), set()
        self._local.db = None
        for db in conns:
            db.close()
        if self.ledger is not None:
            self.ledger.close()

    # ---------------------------------------------------------------------------------------- intake
    def accept(self, message: WebhookMessage, planned: list[Planned],
               now: float | None = None) -> tuple[bool, list[int]]:
        """Persist `message` and its planned deliveries in one transaction.

        Returns (accepted, delivery ids); accepted is False for a redelivery seen within the dedup window.
        A resolved message cancels the group's pending escalations and resolves delivered ones.
        Raises OutboxError when nothing could be written (the caller answers 5xx).
        """
        now = time.time() if now is None else now
        return self._write("intake", lambda db: self._accept_in(db, message, planned, now))

    def accept_batch(self, items: list[tuple[WebhookMessage, list[Planned], float, Future]]) -> None:
        """Group commit: persist several webhooks in one transaction (one fsync) and settle each future with
        accept()'s result, or OutboxError for all when the commit fails. Each webhook runs in its own
        savepoint, so an error in one (a bug, not the disk) fails only its own future."""
        results: list[tuple[Future, object]] = []

        def write(db):
            for message, planned, now, future in items:
                db.execute("SAVEPOINT webhook")
                try:
                    results.append((future, self._accept_in(db, message, planned, now)))
                    db.execute("RELEASE webhook")
                except sqlite3.OperationalError:
                    raise  # the disk or the database (full, I/O error, locked): the whole batch fails
                except Exception as exc:  # noqa: BLE001 - this webhook only (a bug or an unstorable value)
                    db.execute("ROLLBACK TO webhook")
                    db.execute("RELEASE webhook")
                    log.exception("could not store webhook %s", message.group_key[:200])
                    results.append((future, OutboxError(f"cannot store this webhook: {type(exc).__name__}")))

        try:
            self._write("intake", write)
        except OutboxError as exc:
            for *_, future in items:
                future.set_exception(exc)
            return
        for future, result in results:
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _accept_in(self, db, message: WebhookMessage, planned: list[Planned], now: float) -> tuple[bool, list[int]]:
        key = message.delivery_key()
        seen = db.execute("SELECT received_at FROM intake WHERE key=?", (key,)).fetchone()
        if seen is not None and now - seen["received_at"] < self.dedup_window_s:
            return False, []
        db.execute("INSERT OR REPLACE INTO intake(key, received_at) VALUES (?, ?)", (key, now))
        mid = db.execute("INSERT INTO messages(body, received_at, delivery_key) VALUES (?, ?, ?)",
                         (json.dumps(message.to_json(), ensure_ascii=False), now, key)).lastrowid
        ids = []
        for p in planned:
            if p.kind == "escalation" and db.execute(
                    "SELECT 1 FROM deliveries WHERE group_key=? AND channel=? AND kind='escalation' "
                    "AND (state='pending' OR (state='delivered' AND status='firing' AND last_reason!='resolved'))",
                    (message.group_key, p.channel)).fetchone():
                continue  # this group already has its escalation queued or sent
            ids.append(self._insert(db, mid, p, message, now))
        if message.status == "resolved":
            ids += self._resolve_escalations(db, mid, message, now)
        ended = [(a.fingerprint, parse_time(a.ends_at)) for a in message.resolved]
        db.executemany("INSERT INTO resolutions(group_key, fingerprint, ends_at, received_at) VALUES (?,?,?,?) "
                       "ON CONFLICT(group_key, fingerprint) DO UPDATE SET ends_at=MAX(ends_at, excluded.ends_at), "
                       "received_at=excluded.received_at",
                       [(message.group_key, fp, end, now) for fp, end in ended if fp and end is not None])
        if now - self._last_prune > 60:
            db.execute("DELETE FROM intake WHERE received_at < ?", (now - self.dedup_window_s,))
            db.execute("DELETE FROM resolutions WHERE received_at < ?", (now - self.dedup_window_s,))
            self._last_prune = now
        return True, ids

    # ---------------------------------------------------------------------------------- what it saw
    def seen(self, delivery_key: str, now: float | None = None) -> bool:
        """Was a webhook with this delivery key accepted within the dedup window?"""
        now = time.time() if now is None else now
        row = self._db().execute("SELECT received_at FROM intake WHERE key=?", (delivery_key,)).fetchone()
        return row is not None and now - row["received_at"] < self.dedup_window_s

    def resolutions(self, group_key: str, now: float | None = None) -> dict[str, float]:
        """{fingerprint: latest endsAt (epoch s)} of the group's alerts reported resolved within the dedup window."""
        now = time.time() if now is None else now
        rows = self._db().execute("SELECT fingerprint, ends_at FROM resolutions WHERE group_key=? AND received_at>=?",
                                  (group_key, now - self.dedup_window_s)).fetchall()
        return {r["fingerprint"]: r["ends_at"] for r in rows}

    @staticmethod
    def _insert(db, mid: int, p: Planned, message: WebhookMessage, now: float, status: str | None = None) -> int:
        if p.dead_reason:
            return db.execute(
                "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, state, "
                "created_at, next_attempt_at, finished_at, last_reason, last_error) "
                "VALUES (?,?,?,?,?,?,?,'dead',?,?,?,?,?)",
                (mid, p.channel, p.kind, message.group_key, status or message.status, p.route,
                 min(message.alert_count(), SQLITE_INT_MAX), now, now, now, p.dead_reason,
                 "no route matched and no channel can take it (set notifier.unrouted_receivers)")).lastrowid
        return db.execute(
            "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, created_at, "
            "next_attempt_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (mid, p.channel, p.kind, message.group_key, status or message.status, p.route,
             min(message.alert_count(), SQLITE_INT_MAX), max(now, p.not_before), max(now, p.not_before))).lastrowid

    def _resolve_escalations(self, db, mid: int, message: WebhookMessage, now: float) -> list[int]:
        """Cancel the group's pending escalations and queue a resolve to every channel an escalation may have
        paged: those delivered, and those already due, which the worker may be sending at this very moment
        (its "delivered" would then find the row cancelled: a page nobody resolves). A resolve for a page that
        never went out is harmless (PagerDuty ignores a resolve for a dedup key without an open incident)."""
        open_escalations = ("group_key=? AND kind='escalation' AND ((state='delivered' AND status='firing' "
                            "AND last_reason!='resolved') OR (state='pending' AND next_attempt_at<=?))")
        paged = db.execute(f"SELECT DISTINCT channel, route FROM deliveries WHERE {open_escalations}",
                           (message.group_key, now)).fetchall()
        db.execute("UPDATE deliveries SET state='cancelled', finished_at=?, last_reason='resolved' "
                   "WHERE group_key=? AND kind='escalation' AND state='pending'", (now, message.group_key))
        ids = []
        for row in paged:
            # The escalation paged (or may be paging) someone: tell the same channel it is over.
            ids.append(self._insert(db, mid, Planned(row["channel"], "escalation", row["route"], now), message, now))
        # Marked, not changed: the row stays delivered, but the group may escalate afresh if it fires again.
        db.execute("UPDATE deliveries SET last_reason='resolved' WHERE group_key=? AND kind='escalation' AND "
                   "state='delivered' AND status='firing' AND last_reason!='resolved'", (message.group_key,))
        return ids

    # --------------------------------------------------------------------------------------- worker
    def due(self, channel: str, now: float, limit: int = 10_000, exclude: frozenset[int] | set[int] = frozenset()
            ) -> list[Delivery]:
        """Pending rows of `channel` due by `now`, oldest first, at most `limit`, leaving out `exclude` (rows
        whose outcome the worker holds but has not written yet)."""
        rows = self._db().execute(
            "SELECT * FROM deliveries WHERE state='pending' AND channel=? AND next_attempt_at<=? ORDER BY id LIMIT ?",
            (channel, now, limit + len(exclude))).fetchall()
        return [Delivery(**dict(r)) for r in rows if r["id"] not in exclude][:limit]

    def due_of(self, ids: list[int], now: float) -> list[int]:
        """Those of `ids` that are pending and due by `now` (what the worker sends at once)."""
        out: list[int] = []
        db = self._db()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            out += [r["id"] for r in db.execute(
                f"SELECT id FROM deliveries WHERE id IN ({','.join('?' * len(chunk))}) AND state='pending' "
                "AND next_attempt_at<=?", (*chunk, now))]
        return out

    def count_due(self, channel: str, now: float, limit: int) -> int:
        """Due rows of `channel`, counted up to `limit` (bounded work under any backlog)."""
        return self._db().execute("SELECT COUNT(*) AS n FROM (SELECT 1 FROM deliveries WHERE state='pending' AND "
                                  "channel=? AND next_attempt_at<=? LIMIT ?)", (channel, now, limit)).fetchone()["n"]

    def next_due(self, channel: str) -> float | None:
        row = self._db().execute("SELECT MIN(next_attempt_at) AS t FROM deliveries WHERE state='pending' AND "
                                 "channel=?", (channel,)).fetchone()
        return row["t"]

    def messages(self, ids: list[int]) -> dict[int, WebhookMessage]:
        out = {}
        db = self._db()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            for r in db.execute(f"SELECT id, body FROM messages WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                out[r["id"]] = message_from_dict(json.loads(r["body"]))
        return out

    def record(self, outcomes: list["Outcome"]) -> None:
        """Write what became of deliveries, all in one transaction. Error texts are redacted here, the one
        place every stored error passes, so `outbox list` never shows a secret. Raises OutboxError."""
        def write(db):
            for o in outcomes:
                error = redact(o.error)
                if o.state == "pending":
                    db.executemany("UPDATE deliveries SET attempts=attempts+1, next_attempt_at=?, last_reason=?, "
                                   "last_error=? WHERE id=? AND state='pending'",
                                   [(at, o.reason, error, i) for i, at in o.schedule])
                else:
                    tried = 0 if o.state in ("superseded", "cancelled") else 1
                    db.executemany("UPDATE deliveries SET state=?, finished_at=?, attempts=attempts+?, "
                                   "last_reason=?, last_error=? WHERE id=? AND state='pending'",
                                   [(o.state, o.at, tried, o.reason, error, i) for i in o.ids])
                    if o.state == "delivered":
                        # An escalation a resolve cancelled while it was being sent did reach its channel: the
                        # record says so (the resolve was queued with the cancellation).
                        db.executemany("UPDATE deliveries SET state='delivered', finished_at=?, attempts=attempts+1 "
                                       "WHERE id=? AND state='cancelled' AND kind='escalation' AND "
                                       "last_reason='resolved'", [(o.at, i) for i in o.ids])

        self._write("record", write)

    def finish(self, ids: list[int], state: str, now: float, reason: str = "", error: str = "") -> None:
        self.record([Outcome.finished(ids, state, now, reason, error)])

    def rate_limiter(self, channel: str, limit: int, window_s: float):
        """The destination's rate limiter: this process's own (one notifier per SQLite outbox)."""
        from inferwatch.notifier.ratelimit import RateLimiter

        return RateLimiter(limit, window_s)

    def reschedule(self, schedule: list[tuple[int, float]], reason: str, error: str) -> None:
        self.record([Outcome.retry(schedule, reason, error)])

    # ------------------------------------------------------------------------------------ inspection
    def list(self, states: tuple[str, ...] = ("pending", "dead"), limit: int = 100) -> list[Delivery]:
        rows = self._db().execute(
            f"SELECT * FROM deliveries WHERE state IN ({','.join('?' * len(states))}) ORDER BY id DESC LIMIT ?",
            (*states, limit)).fetchall()
        return [Delivery(**dict(r)) for r in rows]

    def get(self, delivery_id: int) -> Delivery | None:
        r = self._db().execute("SELECT * FROM deliveries WHERE id=?", (delivery_id,)).fetchone()
        return Delivery(**dict(r)) if r else None

    def retry(self, delivery_id: int, now: float | None = None, *, force: bool = False) -> Delivery:
        """Put a dead (or finished) delivery back to pending; its max_delivery_age starts afresh (requeued_at)
        while created_at keeps when it was first queued. KeyError if unknown; AlreadyDelivered for a
        delivered row unless `force` (re-sending is then a deliberate act, not a slip of the id)."""
        now = time.time() if now is None else now

        def write(db):
            row = db.execute("SELECT * FROM deliveries WHERE id=?", (delivery_id,)).fetchone()
            if row is None:
                raise KeyError(delivery_id)
            if row["state"] == "delivered" and not force:
                raise AlreadyDelivered(Delivery(**dict(row)))
            db.execute("UPDATE deliveries SET state='pending', attempts=0, requeued_at=?, next_attempt_at=?, "
                       "finished_at=NULL WHERE id=?", (now, now, delivery_id))

        self._write("record", write)
        delivery = self.get(delivery_id)
        if delivery is None:  # the row was there inside the write; only a concurrent delete removes it
            raise KeyError(delivery_id)
        return delivery

    def counts(self) -> dict[str, int]:
        rows = self._db().execute("SELECT state, COUNT(*) AS n FROM deliveries GROUP BY state").fetchall()
        out = {s: 0 for s in STATES}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def backlog(self, now: float | None = None, *, finished: frozenset[int] = frozenset(),
                held: frozenset[int] = frozenset()) -> tuple[int, int, float]:
        """(pending deliveries, those of them due by now, age in seconds of the oldest due one). A deferred
        escalation is pending but not due: its created_at is when it falls due. Rows the process finished but
        could not record yet (`finished`, e.g. sent while the disk is full) are not counted; rows waiting for
        a retry not recorded yet (`held`) are not due."""
        now = time.time() if now is None else now
        r = self._db().execute("SELECT COUNT(*) AS n, MIN(COALESCE(requeued_at, created_at)) AS oldest FROM "
                               "deliveries WHERE state='pending' AND COALESCE(requeued_at, created_at) <= ? "
                               "AND id NOT IN (SELECT value FROM json_each(?))",
                               (now, json.dumps(sorted(finished | held)))).fetchone()
        depth = self._db().execute("SELECT COUNT(*) AS n FROM deliveries WHERE state='pending' AND id NOT IN "
                                   "(SELECT value FROM json_each(?))", (json.dumps(sorted(finished)),)).fetchone()["n"]
        return depth, r["n"], (now - r["oldest"]) if r["oldest"] else 0.0
