"""`inferwatch notifier outbox copy`: a one-shot copy of a SQLite outbox into the spec's PostgreSQL outbox, for
moving a notifier onto a shared database. Run it with the notifier stopped (its SQLite outbox must not change
meanwhile).

Everything is copied in one PostgreSQL transaction: messages (new ids), their deliveries (every state, with
attempts, errors and times; pending ones are sent by the first replica that claims them), the intake keys and
resolutions still within the dedup window. A message whose delivery key the database already holds is
skipped, so running the copy twice copies nothing the second time.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from inferwatch.notifier.outbox import Delivery
from inferwatch.notifier.pgoutbox import pg_text


def _text(value):
    return pg_text(value) if isinstance(value, str) else value


@dataclasses.dataclass
class CopyReport:
    messages: int = 0
    deliveries: int = 0
    skipped: int = 0  # messages already in the database (by delivery key)
    intake: int = 0
    resolutions: int = 0


def copy_sqlite_to_postgres(sqlite_path: Path, outbox) -> CopyReport:
    """Copy the SQLite outbox at `sqlite_path` (opened read-only) into `outbox` (a PostgresOutbox).
    Raises OutboxError (nothing copied) when the database cannot be written, sqlite3.Error when the file
    cannot be read."""
    src = sqlite3.connect(f"{Path(sqlite_path).resolve().as_uri()}?mode=ro", uri=True)
    src.row_factory = sqlite3.Row
    report = CopyReport()
    columns = [f.name for f in dataclasses.fields(Delivery) if f.name not in ("id", "message_id")]
    try:
        messages = src.execute("SELECT id, body, received_at, delivery_key FROM messages ORDER BY id").fetchall()
        deliveries: dict[int, list[sqlite3.Row]] = {}
        for r in src.execute("SELECT * FROM deliveries ORDER BY id"):
            deliveries.setdefault(r["message_id"], []).append(r)
        intake = src.execute("SELECT key, received_at FROM intake").fetchall()
        resolutions = src.execute("SELECT group_key, fingerprint, ends_at, received_at FROM resolutions").fetchall()
    finally:
        src.close()

    def write(db):
        for m in messages:
            if m["delivery_key"] is not None and db.execute("SELECT 1 FROM messages WHERE delivery_key=%s LIMIT 1",
                                                            (m["delivery_key"],)).fetchone():
                report.skipped += 1
                continue
            mid = db.execute("INSERT INTO messages(body, received_at, delivery_key) VALUES (%s, %s, %s) "
                             "RETURNING id", (m["body"], m["received_at"], m["delivery_key"])).fetchone()["id"]
            report.messages += 1
            for d in deliveries.get(m["id"], []):
                db.execute(f"INSERT INTO deliveries(message_id, {', '.join(columns)}) VALUES "
                           f"(%s, {', '.join(['%s'] * len(columns))})", (mid, *(_text(d[c]) for c in columns)))
                report.deliveries += 1
        for r in intake:
            report.intake += db.execute("INSERT INTO intake(key, received_at) VALUES (%s, %s) ON CONFLICT (key) "
                                        "DO NOTHING", (r["key"], r["received_at"])).rowcount
        for r in resolutions:
            report.resolutions += db.execute(
                "INSERT INTO resolutions(group_key, fingerprint, ends_at, received_at) VALUES (%s,%s,%s,%s) "
                "ON CONFLICT (group_key, fingerprint) DO UPDATE SET ends_at=GREATEST(resolutions.ends_at, "
                "EXCLUDED.ends_at), received_at=GREATEST(resolutions.received_at, EXCLUDED.received_at)",
                (pg_text(r["group_key"]), pg_text(r["fingerprint"]), r["ends_at"], r["received_at"])).rowcount

    outbox._write("intake", write)
    return report
