"""Notifier replicas on one real PostgreSQL outbox (spec notifier.outbox), over HTTP: a webhook posted to two
replicas is delivered once; while PostgreSQL restarts the intake answers 503 and /-/ready 503, then both
recover with nothing acknowledged lost; a replica SIGKILLed mid-send leaves the page to the other once its
lease expires; `notifier outbox list` and `outbox copy` work on the shared database."""

from __future__ import annotations

import json
import signal
import time

import pytest
import requests
import yaml

from inferwatch.cli import main
from inferwatch.notifier.outbox import Outbox
from inferwatch.notifier.service import NotifierService
from inferwatch.spec import spec_from_dict
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, notifier_process, spec_data, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


def pg_spec_data(sims, url: str, **notifier) -> dict:
    return spec_data(sims, outbox={"url": url, "password": "${INFERWATCH_TEST_PGPASSWORD}"}, **notifier)


@pytest.fixture
def two_replicas(sims, pg_database, tmp_path):
    sims.set_mode("ok")
    spec = spec_from_dict(pg_spec_data(sims, pg_database[0]))
    services = [NotifierService(spec, tmp_path / f"data-{i}", port=0).start() for i in range(2)]
    yield services
    for svc in services:
        svc.stop()


def post(url: str, body: dict) -> requests.Response:
    return requests.post(url + "/alerts", data=json.dumps(body), headers=AUTH, timeout=30)


def slack_texts(sims) -> list[str]:
    """The texts of the Slack messages the simulator accepted."""
    return [r.text for r in sims.slack.received]


def test_one_webhook_posted_to_two_replicas_is_delivered_once(two_replicas, sims):
    a, b = two_replicas
    body = webhook("PgDuplicateOnce", "L2")
    assert post(a.url, body).json()["status"] == "accepted"
    assert post(b.url, body).json()["status"] == "duplicate"
    wait_for(lambda: any("PgDuplicateOnce" in t for t in slack_texts(sims)), what="the Slack message")
    wait_for(lambda: a.outbox.counts()["delivered"] == 1, what="the delivery recorded")
    assert b.outbox.counts()["delivered"] == 1  # one row in the shared outbox, claimed by one replica
    assert sum("PgDuplicateOnce" in t for t in slack_texts(sims)) == 1


def test_while_postgresql_restarts_webhooks_get_503_and_nothing_acknowledged_is_lost(two_replicas, sims, postgres):
    a, b = two_replicas
    sims.set_mode("down")  # nothing is delivered yet: what was acknowledged must still be in the outbox after
    assert post(a.url, webhook("PgBeforeRestart", "L2")).status_code == 200
    postgres.stop_fast()
    try:
        answer = post(b.url, webhook("PgDuringRestart", "L2"))
        assert answer.status_code == 503 and "retry" in answer.text
        wait_for(lambda: requests.get(b.url + "/-/ready", timeout=10).status_code == 503, what="b not ready")
        wait_for(lambda: requests.get(a.url + "/-/ready", timeout=10).status_code == 503, what="a not ready")
    finally:
        postgres.start()
    wait_for(lambda: requests.get(b.url + "/-/ready", timeout=10).status_code == 200, what="b ready again")
    assert post(b.url, webhook("PgDuringRestart", "L2")).status_code == 200  # Alertmanager's retry
    sims.set_mode("ok")
    for name in ("PgBeforeRestart", "PgDuringRestart"):
        wait_for(lambda name=name: any(name in t for t in slack_texts(sims)), timeout=30, what=f"{name} delivered")


def test_a_replica_killed_mid_send_leaves_the_page_to_the_other_after_its_lease(sims, pg_database, tmp_path):
    sims.set_mode("hang", hang_s=5.0)  # the provider holds the first send: the replica dies while sending
    data = pg_spec_data(sims, pg_database[0], send_processes=0)
    data["notifier"]["outbox"]["lease"] = "10s"
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    with notifier_process(spec_file, tmp_path / "a", tmp_path / "a.log") as (proc_a, url_a):
        assert post(url_a, webhook("PgKilledMidSend", "L2")).status_code == 200
        wait_for(lambda: sims.slack.in_flight.is_set(), what="a's send held by the provider")
        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(10)
    killed_at = time.monotonic()
    sims.set_mode("ok")
    with notifier_process(spec_file, tmp_path / "b", tmp_path / "b.log"):
        wait_for(lambda: any("PgKilledMidSend" in t for t in slack_texts(sims)), timeout=40,
                 what="b delivers the killed replica's page")
    assert time.monotonic() - killed_at >= 5  # not before a's lease ran out


def test_outbox_list_and_copy_work_on_the_shared_database(sims, pg_database, tmp_path, capsys):
    sqlite_dir = tmp_path / "old"
    old = Outbox(sqlite_dir / "outbox.sqlite3")
    from inferwatch.notifier.model import parse_webhook
    from inferwatch.notifier.outbox import Planned

    message = parse_webhook(json.dumps(webhook("PgCopied", "L2")).encode())
    _, ids = old.accept(message, [Planned("oncall-slack", "notify", 1, 0.0)])
    old.finish(ids, "dead", time.time(), "provider_error", "gave up")
    old.close_all()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(pg_spec_data(sims, pg_database[0])))
    for _ in range(2):  # the second copy finds everything there already
        assert main(["notifier", "outbox", "copy", "--spec", str(spec_file), "--data-dir", str(sqlite_dir)]) == 0
    out = capsys.readouterr().out
    assert "copied 1 webhook(s) and 1 deliveries" in out and "copied 0 webhook(s)" in out
    assert "1 already there" in out
    assert main(["notifier", "outbox", "list", "--spec", str(spec_file)]) == 0
    listing = capsys.readouterr().out
    assert "dead" in listing and "PgCopied" in listing and "totals: pending 0, delivered 0, dead 1" in listing
    assert pg_database[1] not in listing


def test_the_kubernetes_notifier_reads_the_postgresql_password_from_its_secret():
    from inferwatch.deploy.kubernetes import generate as kgen

    spec = spec_from_dict({"notifier": {"outbox": {"url": "postgresql://notifier@db.example:5432/inferwatch",
                                                   "password": "${NOTIFIER_PG_PASSWORD}"}}})
    assert "NOTIFIER_PG_PASSWORD" in kgen.required_secrets(spec)["inferwatch-notifier"]
    (workload,) = [d for d in kgen.documents(spec)["notifier.yaml"] if d["kind"] in ("Deployment", "StatefulSet")]
    env = {e["name"]: e for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NOTIFIER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "inferwatch-notifier",
                                                                        "key": "NOTIFIER_PG_PASSWORD"}
    in_cluster = yaml.safe_load(kgen.spec_text(spec))
    assert in_cluster["notifier"]["outbox"]["url"] == "postgresql://notifier@db.example:5432/inferwatch"


def test_two_replicas_together_keep_a_destinations_rate_limit(sims, pg_database, tmp_path):
    sims.set_mode("ok")
    data = pg_spec_data(sims, pg_database[0])
    data["channels"]["llm-wecom"].update(rate_limit=2, rate_window="4s")  # one message per 2 s, all replicas
    spec = spec_from_dict(data)
    services = [NotifierService(spec, tmp_path / f"data-{i}", port=0).start() for i in range(2)]
    try:
        before = len(sims.wecom.received)
        for i in range(4):  # four groups, posted to both replicas in turn
            assert post(services[i % 2].url, webhook(f"PgRate{i}", "L3", group=f"rate-{i}")).status_code == 200
        wait_for(lambda: services[0].outbox.counts()["pending"] == 0, timeout=40, what="every group delivered")
        times = sorted(r.at for r in sims.wecom.received[before:])
        assert all("PgRate" in r.text for r in sims.wecom.received[before:])
        assert 2 <= len(times) <= 4
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        # Started 2 s apart across both replicas; received times also carry each send's own latency.
        assert min(gaps) >= 1.5, times
    finally:
        for svc in services:
            svc.stop()
