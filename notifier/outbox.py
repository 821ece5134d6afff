"""Durable outbox: SQLite in WAL mode with synchronous=FULL, so a webhook acknowledged with 2xx is on disk.

Tables: `intake` (delivery keys of recent webhooks, for redelivery detection), `messages` (webhook bodies),
`deliveries` (one row per message × channel: pending → delivered | dead | superseded | cancelled).
Every state change is one transaction, so a process killed at any instant (SIGKILL mid-delivery included)
leaves each row either pending (sent again after restart: at-least-once) or finished.
Each thread gets its own connection (sqlite3 connections are not shared across threads).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from pathlib import Path

from inferwatch.notifier.model import WebhookMessage, message_from_dict

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
"""

STATES = ("pending", "delivered", "dead", "superseded", "cancelled")


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


class AlreadyDelivered(RuntimeError):
    """`retry` of a delivered row without force=True; `.delivery` is the row (finished_at = when)."""

    def __init__(self, delivery: "Delivery"):
        super().__init__(f"delivery {delivery.id} was already delivered")
        self.delivery = delivery


class Outbox:
    def __init__(self, path: str | Path, *, dedup_window_s: float = 1800.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.dedup_window_s = dedup_window_s
        self._local = threading.local()
        self._db().executescript(SCHEMA)  # idempotent; executescript manages its own transaction
        cols = {r["name"] for r in self._db().execute("PRAGMA table_info(deliveries)")}
        if "requeued_at" not in cols:  # an outbox written by an older version
            try:
                self._db().execute("ALTER TABLE deliveries ADD COLUMN requeued_at REAL")
            except sqlite3.OperationalError as exc:  # another process (the CLI, the service) added it first
                if "duplicate column" not in str(exc):
                    raise
        self._last_prune = 0.0

    # ---------------------------------------------------------------------------------- connections
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            # FULL: the commit is fsynced before we answer 2xx; NORMAL could lose the last commits on power loss.
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            self._local.db = db
        return db

    class _Tx:
        def __init__(self, db):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type, exc, tb):
            if exc_type is None:
                self.db.execute("COMMIT")
            else:
                self.db.execute("ROLLBACK")
            return False

    def _tx(self) -> "_Tx":
        return self._Tx(self._db())

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # ---------------------------------------------------------------------------------------- intake
    def accept(self, message: WebhookMessage, planned: list[Planned], now: float | None = None) -> tuple[bool, list[int]]:
        """Persist `message` and its planned deliveries in one transaction.

        Returns (accepted, delivery ids); accepted is False for a redelivery seen within the dedup window.
        A resolved message cancels the group's pending escalations and resolves delivered ones.
        Raises OutboxError when nothing could be written (the caller answers 5xx).
        """
        now = time.time() if now is None else now
        key = message.delivery_key()
        try:
            with self._tx() as db:
                seen = db.execute("SELECT received_at FROM intake WHERE key=?", (key,)).fetchone()
                if seen is not None and now - seen["received_at"] < self.dedup_window_s:
                    return False, []
                db.execute("INSERT OR REPLACE INTO intake(key, received_at) VALUES (?, ?)", (key, now))
                mid = db.execute("INSERT INTO messages(body, received_at) VALUES (?, ?)",
                                 (json.dumps(message.to_json(), ensure_ascii=False), now)).lastrowid
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
                if now - self._last_prune > 60:
                    db.execute("DELETE FROM intake WHERE received_at < ?", (now - self.dedup_window_s,))
                    self._last_prune = now
                return True, ids
        except sqlite3.Error as exc:
            raise OutboxError(f"outbox write failed: {exc}") from exc

    @staticmethod
    def _insert(db, mid: int, p: Planned, message: WebhookMessage, now: float, status: str | None = None) -> int:
        if p.dead_reason:
            return db.execute(
                "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, state, "
                "created_at, next_attempt_at, finished_at, last_reason, last_error) "
                "VALUES (?,?,?,?,?,?,?,'dead',?,?,?,?,?)",
                (mid, p.channel, p.kind, message.group_key, status or message.status, p.route,
                 message.alert_count(), now, now, now, p.dead_reason,
                 "no route matched and no channel can take it (set notifier.unrouted_receivers)")).lastrowid
        return db.execute(
            "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, created_at, "
            "next_attempt_at) VALUES (?,?,?,?,?,?,?,?,?)",
            (mid, p.channel, p.kind, message.group_key, status or message.status, p.route,
             message.alert_count(), max(now, p.not_before), max(now, p.not_before))).lastrowid

    def _resolve_escalations(self, db, mid: int, message: WebhookMessage, now: float) -> list[int]:
        db.execute("UPDATE deliveries SET state='cancelled', finished_at=?, last_reason='resolved' "
                   "WHERE group_key=? AND kind='escalation' AND state='pending'", (now, message.group_key))
        ids = []
        open_escalations = ("group_key=? AND kind='escalation' AND state='delivered' AND status='firing' "
                            "AND last_reason!='resolved'")
        for row in db.execute(f"SELECT DISTINCT channel, route FROM deliveries WHERE {open_escalations}",
                              (message.group_key,)).fetchall():
            # The escalation paged someone: tell the same channel it is over (PagerDuty: resolve).
            ids.append(self._insert(db, mid, Planned(row["channel"], "escalation", row["route"], now), message, now))
        # Marked, not changed: the row stays delivered, but the group may escalate afresh if it fires again.
        db.execute(f"UPDATE deliveries SET last_reason='resolved' WHERE {open_escalations}", (message.group_key,))
        return ids

    # --------------------------------------------------------------------------------------- worker
    def due(self, channel: str, now: float, limit: int = 10_000) -> list[Delivery]:
        rows = self._db().execute(
            "SELECT * FROM deliveries WHERE state='pending' AND channel=? AND next_attempt_at<=? ORDER BY id LIMIT ?",
            (channel, now, limit)).fetchall()
        return [Delivery(**dict(r)) for r in rows]

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

    def finish(self, ids: list[int], state: str, now: float, reason: str = "", error: str = "") -> None:
        assert state in STATES
        with self._tx() as db:
            db.executemany("UPDATE deliveries SET state=?, finished_at=?, attempts=attempts+?, last_reason=?, "
                           "last_error=? WHERE id=? AND state='pending'",
                           [(state, now, 0 if state in ("superseded", "cancelled") else 1, reason, error, i)
                            for i in ids])

    def reschedule(self, schedule: list[tuple[int, float]], reason: str, error: str) -> None:
        with self._tx() as db:
            db.executemany("UPDATE deliveries SET attempts=attempts+1, next_attempt_at=?, last_reason=?, "
                           "last_error=? WHERE id=? AND state='pending'",
                           [(at, reason, error, i) for i, at in schedule])

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
        with self._tx() as db:
            row = db.execute("SELECT * FROM deliveries WHERE id=?", (delivery_id,)).fetchone()
            if row is None:
                raise KeyError(delivery_id)
            if row["state"] == "delivered" and not force:
                raise AlreadyDelivered(Delivery(**dict(row)))
            db.execute("UPDATE deliveries SET state='pending', attempts=0, requeued_at=?, next_attempt_at=?, "
                       "finished_at=NULL WHERE id=?", (now, now, delivery_id))
        return self.get(delivery_id)

    def counts(self) -> dict[str, int]:
        rows = self._db().execute("SELECT state, COUNT(*) AS n FROM deliveries GROUP BY state").fetchall()
        out = {s: 0 for s in STATES}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def pending_stats(self, now: float | None = None) -> tuple[int, float]:
        """(pending deliveries, age in seconds of the oldest pending one that is due)."""
        now = time.time() if now is None else now
        # created_at of a deferred escalation is when it falls due, so it does not look old while it waits.
        r = self._db().execute("SELECT MIN(COALESCE(requeued_at, created_at)) AS oldest FROM deliveries "
                               "WHERE state='pending' AND COALESCE(requeued_at, created_at) <= ?", (now,)).fetchone()
        depth = self._db().execute("SELECT COUNT(*) AS n FROM deliveries WHERE state='pending'").fetchone()["n"]
        return depth, (now - r["oldest"]) if r["oldest"] else 0.0
