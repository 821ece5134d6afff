"""The outbox's behaviour on both backends (SQLite and a real PostgreSQL), then what only a shared PostgreSQL
outbox does: two replicas on one database accept a webhook once, claim a row once (SKIP LOCKED), take over a
killed replica's row when its lease expires, share a destination's rate limit, and answer 503 while the
database is away without losing what they acknowledged."""

from __future__ import annotations

import json
import threading
import time

import pytest

from inferwatch.errors import UsageError
from inferwatch.notifier.model import parse_webhook
from inferwatch.notifier.outbox import AlreadyDelivered, Outbox, OutboxError, Outcome, Planned
from inferwatch.notifier.pgoutbox import SCHEMA_VERSION, PostgresOutbox
from inferwatch.spec import spec_from_dict
from inferwatch.specload import SpecError
from notifier_support import wait_for, webhook

NOW = 1_800_000_000.0


def message(starts_at: str = "2026-01-01T00:00:00.000Z", **kw):
    """A parsed webhook whose alerts began at `starts_at` (fixed: the delivery key depends on it)."""
    body = webhook(**kw)
    for alert in body["alerts"]:
        alert["startsAt"] = starts_at
    return parse_webhook(json.dumps(body).encode())


def planned(channel: str = "oncall-slack", kind: str = "notify", not_before: float = 0.0) -> list[Planned]:
    return [Planned(channel, kind, 1, not_before)]


@pytest.fixture(params=["sqlite", "postgresql"])
def outbox(request, tmp_path):
    if request.param == "sqlite":
        ob = Outbox(tmp_path / "outbox.sqlite3")
    else:
        url, password = request.getfixturevalue("pg_database")
        ob = PostgresOutbox(url, password)
    yield ob
    ob.close_all()


@pytest.fixture
def replicas(pg_database):
    """Two notifier replicas' outboxes on one PostgreSQL database (short leases, to see them expire)."""
    url, password = pg_database
    obs = [PostgresOutbox(url, password, lease_s=1.0) for _ in range(2)]
    yield obs
    for ob in obs:
        ob.close_all()


# ----------------------------------------------------------------------------------- both backends
def test_a_webhook_is_stored_claimed_and_its_outcome_recorded(outbox):
    accepted, ids = outbox.accept(message(), planned(), NOW)
    assert accepted and len(ids) == 1
    due = outbox.due("oncall-slack", NOW)
    assert [d.id for d in due] == ids and due[0].state == "pending" and due[0].alerts == 1
    assert outbox.messages([due[0].message_id])[due[0].message_id].group_key == message().group_key
    outbox.record([Outcome.finished(ids, "delivered", NOW + 1)])
    assert outbox.due("oncall-slack", NOW + 2) == []
    assert outbox.get(ids[0]).state == "delivered" and outbox.get(ids[0]).finished_at == NOW + 1
    assert outbox.counts()["delivered"] == 1 and outbox.counts()["pending"] == 0


@pytest.mark.parametrize("later_s, accepted", [(1.0, False), (1799.0, False), (1801.0, True)])
def test_a_copy_within_the_dedup_window_is_a_duplicate(outbox, later_s, accepted):
    assert outbox.accept(message(), planned(), NOW)[0]
    again, ids = outbox.accept(message(), planned(), NOW + later_s)
    assert again is accepted and (len(ids) == 1) is accepted
    assert outbox.seen(message().delivery_key(), NOW + later_s)  # stored, or refreshed by the new copy


def test_a_retry_waits_for_its_time_and_a_dead_letter_is_replayed(outbox):
    _, ids = outbox.accept(message(), planned(), NOW)
    outbox.record([Outcome.retry([(ids[0], NOW + 30)], "provider_error", "HTTP 502")])
    assert outbox.due("oncall-slack", NOW + 29) == []
    (row,) = outbox.due("oncall-slack", NOW + 30)
    assert row.attempts == 1 and row.last_reason == "provider_error"
    outbox.finish(ids, "dead", NOW + 31, "max_age", "gave up")
    assert [d.id for d in outbox.list(("dead",))] == ids
    again = outbox.retry(ids[0], NOW + 40)
    assert again.state == "pending" and again.requeued_at == NOW + 40 and again.created_at == NOW
    outbox.finish(ids, "delivered", NOW + 41)
    with pytest.raises(AlreadyDelivered):
        outbox.retry(ids[0], NOW + 42)
    with pytest.raises(KeyError):
        outbox.retry(10_000, NOW)


def test_a_resolve_cancels_the_pending_escalation_and_records_the_resolution(outbox):
    _, ids = outbox.accept(message(), planned("phone", "escalation", NOW + 600), NOW)
    accepted, resolve_ids = outbox.accept(message(status="resolved"), planned(), NOW + 10)
    assert accepted and len(resolve_ids) == 1
    assert outbox.get(ids[0]).state == "cancelled"
    assert set(outbox.resolutions(message().group_key, NOW + 10)) == {f"{0:016x}"}


def test_backlog_counts_pending_and_due_rows(outbox):
    outbox.accept(message(alertname="A"), planned(), NOW)
    outbox.accept(message(alertname="B"), planned(not_before=NOW + 100), NOW)
    depth, due, oldest = outbox.backlog(NOW + 5)
    assert (depth, due, oldest) == (2, 1, 5.0)
    assert outbox.count_due("oncall-slack", NOW + 5, 10) == 1
    assert outbox.next_due("oncall-slack") == NOW


def test_a_nul_in_a_group_key_label_or_error_is_stored_and_the_outbox_stays_writable(outbox):
    body = webhook(group="{}:{job=\"a\x00b\"}", extra={"pod": "p\x00"})
    body["alerts"][0]["startsAt"] = "2026-01-01T00:00:00.000Z"
    nul = parse_webhook(json.dumps(body).encode())
    accepted, ids = outbox.accept(nul, planned(), NOW)
    assert accepted and outbox.writable
    (row,) = outbox.due("oncall-slack", NOW)
    assert outbox.messages([row.message_id])[row.message_id].group_key == nul.group_key  # the body keeps it
    outbox.record([Outcome.retry([(ids[0], NOW + 1)], "provider_error", "answer: bad\x00byte")])
    assert outbox.writable and outbox.get(ids[0]).attempts == 1
    assert outbox.accept(nul, planned(), NOW + 2)[0] is False  # its copy is still recognised


def test_a_probe_writes_and_keeps_the_outbox_writable(outbox):
    assert outbox.probe(1024) is True and outbox.writable and outbox.write_error is None


# ------------------------------------------------------------------------------- PostgreSQL only
def test_one_webhook_posted_to_two_replicas_at_once_is_stored_once(replicas):
    results: list[tuple[bool, list[int]]] = []
    barrier = threading.Barrier(2)

    def post(ob):
        barrier.wait()
        results.append(ob.accept(message(), planned(), NOW))

    threads = [threading.Thread(target=post, args=(ob,)) for ob in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r[0] for r in results) == [False, True]
    assert replicas[0].counts()["pending"] == 1


def test_a_firing_copy_after_its_resolution_on_another_replica_is_kept_not_delivered(replicas):
    a, b = replicas
    assert a.accept(message(status="resolved"), planned(), NOW)[0]
    # A late copy from an Alertmanager peer: the alert began before the resolution's endsAt (2030).
    accepted, ids = b.accept(message(), planned(), NOW + 1)
    assert accepted and ids == []


def test_two_replicas_never_claim_the_same_row(replicas):
    for i in range(40):
        replicas[0].accept(message(alertname=f"A{i}"), planned(), NOW)
    claimed: list[list[int]] = [[], []]
    barrier = threading.Barrier(2)

    def work(i):
        barrier.wait()
        for _ in range(10):  # each keeps what it claimed (in flight: left out, as the worker does)
            claimed[i] += [d.id for d in replicas[i].due("oncall-slack", NOW, limit=3, exclude=set(claimed[i]))]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(claimed[0]).isdisjoint(claimed[1])
    assert len(set(claimed[0]) | set(claimed[1])) == 40


def test_a_killed_replicas_lease_expires_and_the_other_replica_takes_the_row(replicas):
    a, b = replicas
    _, ids = a.accept(message(), planned(), NOW)
    assert [d.id for d in a.due("oncall-slack", NOW)] == ids  # a claims it, then dies mid-send
    a.close_all()
    assert b.due("oncall-slack", NOW) == []  # a's lease is still live
    taken = wait_for(lambda: b.due("oncall-slack", NOW), timeout=10, what="b takes the expired lease")
    assert [d.id for d in taken] == ids
    b.record([Outcome.finished(ids, "delivered", NOW + 2)])
    assert a.get(ids[0]).state == "delivered"  # the outcome is in the same row every replica reads


def test_replicas_share_a_destinations_rate_limit(replicas):
    limiters = [ob.rate_limiter("llm-wecom", 3, 60.0) for ob in replicas]
    sent = 0
    for step in range(120):  # two replicas trying every half second for a minute
        now = NOW + step * 0.5
        for limiter in limiters:
            if limiter.wait_time(now) == 0:
                limiter.record(now)
                sent += 1
    assert sent == 3  # 3 per minute together, not 3 each
    assert limiters[1].wait_time(NOW + 60.0) == 0  # the window moved on


def test_a_provider_block_pauses_every_replica(replicas):
    a, b = (ob.rate_limiter("llm-wecom", 20, 60.0) for ob in replicas)
    a.block(NOW, 30.0)
    assert b.wait_time(NOW + 1) == pytest.approx(29.0)


def test_while_postgresql_is_away_writes_fail_and_nothing_acknowledged_is_lost(postgres, pg_database):
    url, password = pg_database
    ob = PostgresOutbox(url, password)
    try:
        _, ids = ob.accept(message(alertname="Before"), planned(), NOW)
        postgres.stop_fast()
        try:
            with pytest.raises(OutboxError):
                ob.accept(message(alertname="During"), planned(), NOW)
            assert not ob.writable and ob.probe() is False
            with pytest.raises(OutboxError):
                ob.due("oncall-slack", NOW)
        finally:
            postgres.start()
        assert wait_for(lambda: ob.probe(), timeout=30, what="the outbox writable again")
        assert ob.writable and [d.id for d in ob.due("oncall-slack", NOW)] == ids
        assert ob.accept(message(alertname="During"), planned(), NOW)[0]  # the refused one, retried
    finally:
        ob.close_all()


def test_a_newer_schema_is_refused_and_replicas_starting_together_migrate_once(pg_database, postgres):
    url, password = pg_database
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def start():
        barrier.wait()
        try:
            PostgresOutbox(url, password).close_all()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    database = url.rsplit("/", 1)[1]
    with postgres.connect(database) as conn:
        assert conn.execute("SELECT version FROM inferwatch_schema").fetchall() == [(SCHEMA_VERSION,)]
        conn.execute("INSERT INTO inferwatch_schema(version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    with pytest.raises(UsageError, match="newer than this notifier"):
        PostgresOutbox(url, password)


def test_a_wrong_password_is_a_usage_error_without_the_password(pg_database):
    url, _ = pg_database
    with pytest.raises(UsageError) as info:
        PostgresOutbox(url, "not-the-password-5e1f")
    assert "cannot use the PostgreSQL outbox" in str(info.value)
    assert "not-the-password-5e1f" not in str(info.value)


# --------------------------------------------------------------------------------------------- spec
@pytest.mark.parametrize("outbox, error", [
    ({}, None),
    ({"url": "postgresql://notifier@db.example:5432/inferwatch", "password": "${PGPASSWORD}"}, None),
    ({"url": "postgres://notifier@db.example/inferwatch", "password_file": "/run/secrets/pg"}, None),
    ({"url": "postgresql://notifier:hunter2@db.example/inferwatch"}, "notifier.outbox.url: the URL holds a password"),
    ({"url": "mysql://db.example/inferwatch"}, "expected a postgresql:// URL"),
    ({"url": "postgresql://notifier@db.example:port/inferwatch"}, "invalid URL"),
    ({"url": "postgresql://notifier@db.example/"}, "expected a database name"),
    ({"url": "postgresql:///inferwatch"}, "expected a host"),
    ({"password": "${PGPASSWORD}"}, "notifier.outbox.password: set only with url"),
    ({"url": "postgresql://n@db.example/i", "lease": "5s"}, "notifier.outbox.lease: expected at least 10s"),
])
def test_the_outbox_spec_is_validated(outbox, error):
    data = {"notifier": {"outbox": outbox}}
    if error is None:
        spec = spec_from_dict(data)
        assert spec.notifier.outbox.url == outbox.get("url", "")
        return
    with pytest.raises(SpecError, match=error) as info:
        spec_from_dict(data)
    assert "hunter2" not in str(info.value)


def test_a_lost_connection_is_noticed_within_the_wait(postgres, pg_database):
    """Sanity of the helper the tests above rely on: a fast restart keeps what was committed."""
    url, password = pg_database
    ob = PostgresOutbox(url, password)
    try:
        _, ids = ob.accept(message(), planned(), NOW)
        started = time.monotonic()
        postgres.restart_fast()
        assert time.monotonic() - started < 30
        assert wait_for(lambda: ob.probe(), timeout=30, what="writable after the restart")
        assert ob.get(ids[0]) is not None
    finally:
        ob.close_all()
