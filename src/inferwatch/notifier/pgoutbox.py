"""The outbox on a shared PostgreSQL (spec `notifier.outbox.url`), written and read by every notifier replica.

The same tables and methods as the SQLite outbox (outbox.py), with what replicas need from a shared one:

- A webhook's notifications are inserted in one transaction, keyed by the webhook's delivery key
  (`INSERT … ON CONFLICT DO UPDATE … WHERE older than the dedup window`): a copy reaching another replica, or a
  retry, inserts nothing. A per-group advisory lock serialises webhooks of one group, so the stale-firing
  check (a firing copy after its resolution, one query on `resolutions`) sees every resolution committed
  before it. The service answers 2xx after the commit.
- Workers claim due rows (`SELECT … FOR UPDATE SKIP LOCKED`) with a lease on the database's clock: a row
  leased by another live replica is skipped; a replica killed mid-send leaves its lease to expire, then any
  replica takes the row. Outcomes are written in the same row and end the lease.
- Per-destination rate limits are shared (SharedRateLimiter: one row per send, reserved under an advisory
  lock per channel), so replicas together stay within a provider's limit.
- A lost connection is handled as a full disk is with SQLite: the write fails, `write_error` is set (the
  service answers 503 to webhooks and /-/ready), nothing is acknowledged that is not committed, and the next
  use reconnects.

The schema is created and versioned by the notifier itself (table `inferwatch_schema`, SCHEMA_VERSION); a
database written by a newer version is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any, Callable
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row

from inferwatch.errors import UsageError
from inferwatch.notifier.model import WebhookMessage, message_from_dict, parse_time
from inferwatch.notifier.outbox import (
    SQLITE_INT_MAX,
    STATES,
    WRITE_OPERATIONS,
    AlreadyDelivered,
    Delivery,
    OutboxError,
    Outcome,
    Planned,
)
from inferwatch.notifier.stale import stale
from inferwatch.redaction import redact

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Applied in order; migration i takes the schema from version i to i + 1 (so new versions append one).
MIGRATIONS = ["""
CREATE TABLE intake (key TEXT PRIMARY KEY, received_at DOUBLE PRECISION NOT NULL);
CREATE TABLE messages (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL, received_at DOUBLE PRECISION NOT NULL,
                       delivery_key TEXT);
CREATE INDEX messages_key ON messages(delivery_key);
CREATE TABLE deliveries (
    id BIGSERIAL PRIMARY KEY,
    message_id BIGINT NOT NULL REFERENCES messages(id),
    channel TEXT NOT NULL,
    kind TEXT NOT NULL,
    group_key TEXT NOT NULL,
    status TEXT NOT NULL,
    route INTEGER NOT NULL,
    alerts BIGINT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    last_reason TEXT NOT NULL DEFAULT '',
    last_error TEXT NOT NULL DEFAULT '',
    requeued_at DOUBLE PRECISION,
    lease_owner TEXT,                  -- the replica sending it now, until lease_until (the database's clock)
    lease_until DOUBLE PRECISION
);
CREATE INDEX deliveries_due ON deliveries(state, channel, next_attempt_at);
CREATE INDEX deliveries_group ON deliveries(group_key, state);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE resolutions (group_key TEXT NOT NULL, fingerprint TEXT NOT NULL, ends_at DOUBLE PRECISION NOT NULL,
                          received_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (group_key, fingerprint));
CREATE TABLE rate_sends (channel TEXT NOT NULL, at DOUBLE PRECISION NOT NULL);
CREATE INDEX rate_sends_channel ON rate_sends(channel, at);
CREATE TABLE rate_blocks (channel TEXT PRIMARY KEY, until DOUBLE PRECISION NOT NULL);
"""]
SCHEMA_LOCK = 0x1F0B0C5  # advisory lock key held while the schema is created or migrated
COLUMNS = ", ".join(f.name for f in dataclasses.fields(Delivery))
DB_NOW = "extract(epoch from clock_timestamp())"  # leases use the database's clock: replicas' clocks may differ
STATEMENT_TIMEOUT_MS = 30_000  # a statement stuck longer (a lock held by a hung client) fails: 503, not a hang


def connection_target(url: str) -> str:
    """The URL without user and password, for log lines (`postgresql://host:port/db`)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class PostgresOutbox:
    """The outbox in a PostgreSQL database shared by replicas; the methods of outbox.Outbox.

    `url`: postgresql://user@host:port/database; `password`: its password or None (the server's own: peer,
    .pgpass); `lease_s`: how long a claimed delivery stays with this replica (longer than any send);
    `connect_timeout_s`: longest wait for a connection. Raises UsageError when the database cannot be reached
    at start or holds a newer schema."""

    def __init__(self, url: str, password: str | None = None, *, dedup_window_s: float = 1800.0,
                 lease_s: float = 120.0, connect_timeout_s: float = 5.0):
        self.url = url
        self._password = password
        self.path = connection_target(url)  # what log lines name (no credentials)
        self.dedup_window_s = dedup_window_s
        self.lease_s = lease_s
        self.connect_timeout_s = connect_timeout_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"  # this replica's leases
        self.ledger = None  # the database is the record of what was acknowledged (no SQLite ledger)
        self._local = threading.local()
        self._open: set[psycopg.Connection] = set()
        self._open_lock = threading.Lock()
        self._last_prune = 0.0
        self.write_error: str | None = None
        self.write_errors: Counter = Counter({op: 0 for op in WRITE_OPERATIONS})
        self._state_lock = threading.Lock()
        self._on_writable: list[Callable[[], None]] = []
        try:
            self.migrate()
        except psycopg.Error as exc:
            self.close_all()
            raise UsageError(f"cannot use the PostgreSQL outbox {self.path}: {_one_line(exc)}") from None
        except BaseException:  # a newer schema (UsageError): a refused start holds no connection
            self.close_all()
            raise

    # ---------------------------------------------------------------------------------- schema
    def migrate(self) -> int:
        """Create or upgrade the schema to SCHEMA_VERSION (under an advisory lock: replicas starting together
        migrate once); returns the version found before. Raises UsageError for a newer schema."""
        db = self._db()
        with db.transaction():
            db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            db.execute("CREATE TABLE IF NOT EXISTS inferwatch_schema (version INTEGER NOT NULL)")
            row = db.execute("SELECT max(version) AS v FROM inferwatch_schema").fetchone()
            found = row["v"] or 0
            if found > SCHEMA_VERSION:
                raise UsageError(f"the PostgreSQL outbox {self.path} has schema version {found}, newer than this "
                                 f"notifier's {SCHEMA_VERSION}: upgrade the notifier")
            for version in range(found, SCHEMA_VERSION):
                db.execute(MIGRATIONS[version])
                db.execute("INSERT INTO inferwatch_schema(version) VALUES (%s)", (version + 1,))
        return found

    # ---------------------------------------------------------------------------------- connections
    def _db(self) -> Any:  # psycopg.Connection[dict]
        db = getattr(self._local, "db", None)
        if db is None or db.closed or db.broken or db not in self._open:
            if db is not None:
                self._discard(db)
            db = psycopg.connect(self.url, password=self._password, autocommit=True, row_factory=dict_row,
                                 connect_timeout=max(1, round(self.connect_timeout_s)),
                                 options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                                 application_name="inferwatch-notifier",
                                 # A half-open connection (a lost node, a partition) is noticed in seconds.
                                 keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)
            self._local.db = db
            with self._open_lock:
                self._open.add(db)
        return db

    def _discard(self, db: psycopg.Connection) -> None:
        with self._open_lock:
            self._open.discard(db)
        try:
            db.close()
        except psycopg.Error:
            pass

    def _read(self, fn: Callable[[Any], Any]):
        """Run a read; a database error (connection lost) raises OutboxError and drops the connection."""
        db = None
        try:
            db = self._db()
            return fn(db)
        except psycopg.Error as exc:
            if db is not None and (db.broken or isinstance(exc, psycopg.OperationalError)):
                self._discard(db)
                self._local.db = None
            raise OutboxError(f"outbox read failed: {_one_line(exc)}") from exc

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            self._local.db = None
            self._discard(db)

    def close_all(self) -> None:
        with self._open_lock:
            conns, self._open = list(self._open), set()
        self._local.db = None
        for db in conns:
            try:
                db.close()
            except psycopg.Error:
                pass

    # ---------------------------------------------------------------------------------- write state
    @property
    def writable(self) -> bool:
        return self.write_error is None

    def _write(self, operation: str, fn: Callable[[Any], Any]):
        """Run `fn(db)` in one transaction; track the write state. Raises OutboxError (nothing committed, or
        — a connection lost during COMMIT — not known to be: the caller answers 503 and the retry is a no-op
        by its delivery key)."""
        db = None
        try:
            db = self._db()
            with db.transaction():
                result = fn(db)
        except psycopg.Error as exc:
            if db is not None and (db.broken or isinstance(exc, psycopg.OperationalError)):
                self._discard(db)
                self._local.db = None
            self._failed(operation, exc)
            raise OutboxError(f"outbox write failed: {_one_line(exc)}") from exc
        self._succeeded()
        return result

    def _failed(self, operation: str, exc: psycopg.Error) -> None:
        with self._state_lock:
            self.write_errors[operation] += 1
            started = self.write_error is None
            self.write_error = _one_line(exc)
        if started:
            log.error("the PostgreSQL outbox %s cannot be written (%s): webhooks are answered 503 so Alertmanager "
                      "retries, /-/ready answers 503; outcomes of sends are held in memory", self.path,
                      _one_line(exc))

    def _succeeded(self) -> None:
        if self.write_error is None:
            return
        with self._state_lock:
            ended, self.write_error = self.write_error is not None, None
        if ended:
            log.warning("the PostgreSQL outbox %s can be written again", self.path)
            for callback in self._on_writable:
                callback()

    def on_writable(self, callback: Callable[[], None]) -> None:
        self._on_writable.append(callback)

    def probe(self, size: int = 0) -> bool:
        """Try a one-row write (the database's room is the server's concern: `size` is not written); True when
        the outbox can be written."""
        try:
            self._write("probe", lambda db: db.execute(
                "INSERT INTO meta(key, value) VALUES ('probe', %s) ON CONFLICT (key) DO UPDATE SET "
                "value=EXCLUDED.value", (repr(time.time()),)))
        except OutboxError:
            return False
        return True

    # ---------------------------------------------------------------------------------------- intake
    def accept(self, message: WebhookMessage, planned: list[Planned],
               now: float | None = None) -> tuple[bool, list[int]]:
        """As Outbox.accept: (accepted, delivery ids), accepted False for a copy already stored (by any
        replica) within the dedup window. Raises OutboxError."""
        now = time.time() if now is None else now
        return self._write("intake", lambda db: self._accept_in(db, message, planned, now))

    def accept_batch(self, items: list[tuple[WebhookMessage, list[Planned], float, Future]]) -> None:
        """Group commit, as Outbox.accept_batch: one transaction, each webhook in its own savepoint."""
        results: list[tuple[Future, object]] = []

        def write(db):
            for message, planned, now, future in items:
                try:
                    with db.transaction():  # a savepoint
                        results.append((future, self._accept_in(db, message, planned, now)))
                except psycopg.OperationalError:
                    raise  # the connection or the server: the whole batch fails
                except Exception as exc:  # noqa: BLE001 - this webhook only (a bug or an unstorable value)
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
        group = pg_text(message.group_key)
        # One group's webhooks one at a time, across replicas: the stale check below and the escalation
        # bookkeeping then see every earlier webhook of the group committed.
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (group,))
        fresh = db.execute("INSERT INTO intake(key, received_at) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET "
                           "received_at=EXCLUDED.received_at WHERE intake.received_at < %s RETURNING key",
                           (key, now, now - self.dedup_window_s)).fetchone()
        if fresh is None:
            return False, []
        mid = db.execute("INSERT INTO messages(body, received_at, delivery_key) VALUES (%s, %s, %s) RETURNING id",
                         (json.dumps(message.to_json(), ensure_ascii=False), now, key)).fetchone()["id"]
        if message.status == "firing" and message.firing:
            resolved = {r["fingerprint"]: r["ends_at"] for r in db.execute(
                "SELECT fingerprint, ends_at FROM resolutions WHERE group_key=%s AND received_at>=%s AND "
                "fingerprint = ANY(%s)", (group, now - self.dedup_window_s,
                                          [pg_text(a.fingerprint) for a in message.firing])).fetchall()}
            if stale(message, resolved):
                return True, []  # kept (auditable, its copies deduplicated), not delivered
        ids = []
        for p in planned:
            if p.kind == "escalation" and db.execute(
                    "SELECT 1 FROM deliveries WHERE group_key=%s AND channel=%s AND kind='escalation' AND "
                    "(state='pending' OR (state='delivered' AND status='firing' AND last_reason!='resolved'))",
                    (group, pg_text(p.channel))).fetchone():
                continue
            ids.append(self._insert(db, mid, p, message, now))
        if message.status == "resolved":
            ids += self._resolve_escalations(db, mid, message, now)
        ended = [(a.fingerprint, parse_time(a.ends_at)) for a in message.resolved]
        rows = [(group, pg_text(fp), end, now) for fp, end in ended if fp and end is not None]
        if rows:
            with db.cursor() as cur:
                cur.executemany("INSERT INTO resolutions(group_key, fingerprint, ends_at, received_at) VALUES "
                                "(%s,%s,%s,%s) ON CONFLICT (group_key, fingerprint) DO UPDATE SET "
                                "ends_at=GREATEST(resolutions.ends_at, EXCLUDED.ends_at), "
                                "received_at=EXCLUDED.received_at", rows)
        if now - self._last_prune > 60:
            db.execute("DELETE FROM intake WHERE received_at < %s", (now - self.dedup_window_s,))
            db.execute("DELETE FROM resolutions WHERE received_at < %s", (now - self.dedup_window_s,))
            self._last_prune = now
        return True, ids

    @staticmethod
    def _insert(db, mid: int, p: Planned, message: WebhookMessage, now: float) -> int:
        alerts = min(message.alert_count(), SQLITE_INT_MAX)
        group, channel = pg_text(message.group_key), pg_text(p.channel)
        if p.dead_reason:
            return db.execute(
                "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, state, "
                "created_at, next_attempt_at, finished_at, last_reason, last_error) "
                "VALUES (%s,%s,%s,%s,%s,%s,%s,'dead',%s,%s,%s,%s,%s) RETURNING id",
                (mid, channel, p.kind, group, message.status, p.route, alerts, now, now, now,
                 p.dead_reason, "no route matched and no channel can take it (set notifier.unrouted_receivers)")
            ).fetchone()["id"]
        at = max(now, p.not_before)
        return db.execute(
            "INSERT INTO deliveries(message_id, channel, kind, group_key, status, route, alerts, created_at, "
            "next_attempt_at) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING id",
            (mid, channel, p.kind, group, message.status, p.route, alerts, at, at)).fetchone()["id"]

    def _resolve_escalations(self, db, mid: int, message: WebhookMessage, now: float) -> list[int]:
        """As Outbox._resolve_escalations (see there why already-due escalations get a resolve too)."""
        group = pg_text(message.group_key)
        paged = db.execute("SELECT DISTINCT channel, route FROM deliveries WHERE group_key=%s AND kind='escalation' "
                           "AND ((state='delivered' AND status='firing' AND last_reason!='resolved') OR "
                           "(state='pending' AND next_attempt_at<=%s))", (group, now)).fetchall()
        db.execute("UPDATE deliveries SET state='cancelled', finished_at=%s, last_reason='resolved', lease_owner=NULL "
                   "WHERE group_key=%s AND kind='escalation' AND state='pending'", (now, group))
        ids = [self._insert(db, mid, Planned(r["channel"], "escalation", r["route"], now), message, now) for r in paged]
        db.execute("UPDATE deliveries SET last_reason='resolved' WHERE group_key=%s AND kind='escalation' AND "
                   "state='delivered' AND status='firing' AND last_reason!='resolved'", (group,))
        return ids

    # ---------------------------------------------------------------------------------- what it saw
    def seen(self, delivery_key: str, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        row = self._read(lambda db: db.execute("SELECT received_at FROM intake WHERE key=%s",
                                               (delivery_key,)).fetchone())
        return row is not None and now - row["received_at"] < self.dedup_window_s

    def resolutions(self, group_key: str, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        rows = self._read(lambda db: db.execute(
            "SELECT fingerprint, ends_at FROM resolutions WHERE group_key=%s AND received_at>=%s",
            (pg_text(group_key), now - self.dedup_window_s)).fetchall())
        return {r["fingerprint"]: r["ends_at"] for r in rows}

    # --------------------------------------------------------------------------------------- worker
    def due(self, channel: str, now: float, limit: int = 10_000, exclude: frozenset[int] | set[int] = frozenset()
            ) -> list[Delivery]:
        """Pending rows of `channel` due by `now`, oldest first, at most `limit`, leaving out `exclude` and rows
        another replica holds a live lease on; the rows returned are leased to this replica for `lease_s`
        (claimed with FOR UPDATE SKIP LOCKED: two replicas never claim one row)."""
        def claim(db):
            return db.execute(
                f"WITH c AS (SELECT id FROM deliveries WHERE state='pending' AND channel=%s AND next_attempt_at<=%s "
                f"AND NOT (id = ANY(%s)) AND (lease_owner IS NULL OR lease_owner=%s OR lease_until < {DB_NOW}) "
                f"ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
                f"UPDATE deliveries d SET lease_owner=%s, lease_until={DB_NOW} + %s FROM c WHERE d.id=c.id "
                f"RETURNING {', '.join('d.' + c for c in COLUMNS.split(', '))}",
                (channel, now, list(exclude), self.owner, limit, self.owner, self.lease_s)).fetchall()

        rows = self._write("record", claim)
        return sorted((Delivery(**r) for r in rows), key=lambda d: d.id)

    def due_of(self, ids: list[int], now: float) -> list[int]:
        rows = self._read(lambda db: db.execute(
            "SELECT id FROM deliveries WHERE id = ANY(%s) AND state='pending' AND next_attempt_at<=%s ORDER BY id",
            (list(ids), now)).fetchall())
        return [r["id"] for r in rows]

    def count_due(self, channel: str, now: float, limit: int) -> int:
        return self._read(lambda db: db.execute(
            "SELECT COUNT(*) AS n FROM (SELECT 1 FROM deliveries WHERE state='pending' AND channel=%s AND "
            "next_attempt_at<=%s LIMIT %s) AS due", (channel, now, limit)).fetchone()["n"])

    def next_due(self, channel: str) -> float | None:
        """When this replica may next find a row: the earliest due time, or the end of another's lease."""
        row = self._read(lambda db: db.execute(
            "SELECT MIN(CASE WHEN lease_owner IS NOT NULL AND lease_owner<>%s THEN GREATEST(next_attempt_at, "
            f"lease_until - {DB_NOW} + %s) ELSE next_attempt_at END) AS t FROM deliveries WHERE state='pending' "
            "AND channel=%s", (self.owner, time.time(), channel)).fetchone())
        return row["t"]

    def messages(self, ids: list[int]) -> dict[int, WebhookMessage]:
        rows = self._read(lambda db: db.execute("SELECT id, body FROM messages WHERE id = ANY(%s)",
                                                (list(ids),)).fetchall())
        return {r["id"]: message_from_dict(json.loads(r["body"])) for r in rows}

    def record(self, outcomes: list[Outcome]) -> None:
        """As Outbox.record, in one transaction; every outcome ends the row's lease. Raises OutboxError."""
        def write(db):
            with db.cursor() as cur:
                for o in outcomes:
                    error, reason = pg_text(redact(o.error)), pg_text(o.reason)
                    if o.state == "pending":
                        cur.executemany("UPDATE deliveries SET attempts=attempts+1, next_attempt_at=%s, "
                                        "last_reason=%s, last_error=%s, lease_owner=NULL, lease_until=NULL "
                                        "WHERE id=%s AND state='pending'",
                                        [(at, reason, error, i) for i, at in o.schedule])
                        continue
                    tried = 0 if o.state in ("superseded", "cancelled") else 1
                    cur.executemany("UPDATE deliveries SET state=%s, finished_at=%s, attempts=attempts+%s, "
                                    "last_reason=%s, last_error=%s, lease_owner=NULL, lease_until=NULL "
                                    "WHERE id=%s AND state='pending'",
                                    [(o.state, o.at, tried, reason, error, i) for i in o.ids])
                    if o.state == "delivered":
                        cur.executemany("UPDATE deliveries SET state='delivered', finished_at=%s, "
                                        "attempts=attempts+1 WHERE id=%s AND state='cancelled' AND "
                                        "kind='escalation' AND last_reason='resolved'", [(o.at, i) for i in o.ids])

        self._write("record", write)

    def finish(self, ids: list[int], state: str, now: float, reason: str = "", error: str = "") -> None:
        self.record([Outcome.finished(ids, state, now, reason, error)])

    def reschedule(self, schedule: list[tuple[int, float]], reason: str, error: str) -> None:
        self.record([Outcome.retry(schedule, reason, error)])

    def rate_limiter(self, channel: str, limit: int, window_s: float) -> "SharedRateLimiter":
        """The destination's limiter, shared by every replica on this database."""
        return SharedRateLimiter(self, channel, limit, window_s)

    # ------------------------------------------------------------------------------------ inspection
    def list(self, states: tuple[str, ...] = ("pending", "dead"), limit: int = 100) -> list[Delivery]:
        rows = self._read(lambda db: db.execute(f"SELECT {COLUMNS} FROM deliveries WHERE state = ANY(%s) "
                                                "ORDER BY id DESC LIMIT %s", (list(states), limit)).fetchall())
        return [Delivery(**r) for r in rows]

    def get(self, delivery_id: int) -> Delivery | None:
        r = self._read(lambda db: db.execute(f"SELECT {COLUMNS} FROM deliveries WHERE id=%s",
                                             (delivery_id,)).fetchone())
        return Delivery(**r) if r else None

    def retry(self, delivery_id: int, now: float | None = None, *, force: bool = False) -> Delivery:
        """As Outbox.retry. KeyError if unknown; AlreadyDelivered for a delivered row unless `force`."""
        now = time.time() if now is None else now

        def write(db):
            row = db.execute(f"SELECT {COLUMNS} FROM deliveries WHERE id=%s FOR UPDATE", (delivery_id,)).fetchone()
            if row is None:
                raise KeyError(delivery_id)
            if row["state"] == "delivered" and not force:
                raise AlreadyDelivered(Delivery(**row))
            db.execute("UPDATE deliveries SET state='pending', attempts=0, requeued_at=%s, next_attempt_at=%s, "
                       "finished_at=NULL, lease_owner=NULL, lease_until=NULL WHERE id=%s", (now, now, delivery_id))

        self._write("record", write)
        d = self.get(delivery_id)
        if d is None:  # removed meanwhile (by hand): as unknown
            raise KeyError(delivery_id)
        return d

    def counts(self) -> dict[str, int]:
        rows = self._read(lambda db: db.execute("SELECT state, COUNT(*) AS n FROM deliveries GROUP BY state")
                          .fetchall())
        out = {s: 0 for s in STATES}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def backlog(self, now: float | None = None, *, finished: frozenset[int] = frozenset(),
                held: frozenset[int] = frozenset()) -> tuple[int, int, float]:
        """As Outbox.backlog: (pending, due, age of the oldest due in seconds), over every replica's rows."""
        now = time.time() if now is None else now

        def read(db):
            r = db.execute("SELECT COUNT(*) AS n, MIN(COALESCE(requeued_at, created_at)) AS oldest FROM deliveries "
                           "WHERE state='pending' AND COALESCE(requeued_at, created_at) <= %s AND NOT (id = ANY(%s))",
                           (now, sorted(finished | held))).fetchone()
            depth = db.execute("SELECT COUNT(*) AS n FROM deliveries WHERE state='pending' AND NOT (id = ANY(%s))",
                               (sorted(finished),)).fetchone()["n"]
            return depth, r["n"], (now - r["oldest"]) if r["oldest"] else 0.0

        return self._read(read)


class SharedRateLimiter:
    """ratelimit.RateLimiter's interface over the shared database: at most `limit` sends of `channel` in any
    `window_s` by all replicas together, spaced by window/limit. wait_time() reserves the send it allows
    (under an advisory lock per channel, so two replicas cannot both take the last slot); record() then
    consumes that reservation, or records an unreserved send (a resend). A database error raises OutboxError
    (the worker's pass fails and is tried again: nothing can be claimed meanwhile either)."""

    def __init__(self, outbox: PostgresOutbox, channel: str, limit: int, window_s: float):
        if limit < 1 or window_s <= 0:
            raise ValueError(f"rate limit needs limit >= 1 and window > 0, got {limit}/{window_s}s")
        self.outbox = outbox
        self.channel = channel
        self.limit = limit
        self.window_s = window_s
        self.spacing_s = window_s / limit
        self._reserved = threading.local()

    def wait_time(self, now: float) -> float:
        """Seconds until a send is allowed (0 = now, and the send is reserved for this thread's record())."""
        def check(db):
            db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", ("rate:" + self.channel,))
            db.execute("DELETE FROM rate_sends WHERE channel=%s AND at <= %s", (self.channel, now - self.window_s))
            r = db.execute("SELECT COUNT(*) AS n, MIN(at) AS first, MAX(at) AS last FROM rate_sends WHERE "
                           "channel=%s AND at > %s", (self.channel, now - self.window_s)).fetchone()
            b = db.execute("SELECT until FROM rate_blocks WHERE channel=%s", (self.channel,)).fetchone()
            waits = [b["until"] - now if b else 0.0]
            if r["n"]:
                waits.append(r["last"] + self.spacing_s - now)
                if r["n"] >= self.limit:
                    waits.append(r["first"] + self.window_s - now)
            wait = max(0.0, *waits)
            if wait == 0:
                db.execute("INSERT INTO rate_sends(channel, at) VALUES (%s, %s)", (self.channel, now))
            return wait

        wait = self.outbox._write("record", check)
        self._reserved.pending = wait == 0
        return wait

    def record(self, now: float) -> None:
        if getattr(self._reserved, "pending", False):
            self._reserved.pending = False
            return
        self.outbox._write("record", lambda db: db.execute("INSERT INTO rate_sends(channel, at) VALUES (%s, %s)",
                                                           (self.channel, now)))

    def block(self, now: float, seconds: float) -> None:
        self.outbox._write("record", lambda db: db.execute(
            "INSERT INTO rate_blocks(channel, until) VALUES (%s, %s) ON CONFLICT (channel) DO UPDATE SET "
            "until=GREATEST(rate_blocks.until, EXCLUDED.until)", (self.channel, now + seconds)))


def pg_text(value: str) -> str:
    """`value` as PostgreSQL can store it in a text column: a NUL (0x00), which PostgreSQL refuses in text and
    a webhook may hold (a label value, a group key) or a provider's answer, becomes U+FFFD. The webhook body is
    stored as JSON, where NUL is escaped, so the message itself keeps it."""
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _one_line(exc: BaseException) -> str:
    return redact(" ".join(str(exc).split()))[:300] or type(exc).__name__
