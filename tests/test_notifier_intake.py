"""Intake over HTTP (the real aiohttp server, in-process): authentication, size limit, malformed and
hostile payloads (fuzzed), redelivery recognised, 5xx only when the outbox cannot persist; routing,
escalation, and the `routes test` / `outbox` commands."""

from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT
from inferwatch.cli import main
from inferwatch.notifier.outbox import OutboxError
from inferwatch.notifier.routing import Router
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, TOKEN, fixture_body, make_spec, spec_data, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


@pytest.fixture(params=["sqlite", "postgresql"])
def service(request, sims, tmp_path):
    """The notifier on each outbox backend: SQLite in its data folder, and a real PostgreSQL (a fresh database)."""
    sims.set_mode("ok")
    outbox = {}
    if request.param == "postgresql":
        url, _ = request.getfixturevalue("pg_database")
        outbox = {"outbox": {"url": url, "password": "${INFERWATCH_TEST_PGPASSWORD}"}}
    svc = NotifierService(make_spec(sims, max_body_bytes=65536, **outbox), tmp_path / "data", port=0).start()
    yield svc
    svc.stop()


@pytest.fixture
def sqlite_service(sims, tmp_path):
    """The notifier on its SQLite outbox, for what only SQLite has (its file, its transactions)."""
    sims.set_mode("ok")
    svc = NotifierService(make_spec(sims, max_body_bytes=65536), tmp_path / "data", port=0).start()
    yield svc
    svc.stop()


def post(svc, body, headers=AUTH, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(svc.url + "/alerts", data=data, headers={**headers, "Content-Type": "application/json"},
                         timeout=10)


def test_the_real_alertmanager_fixture_is_accepted_and_delivered_to_phone(service, sims):
    r = post(service, fixture_body())
    assert r.status_code == 200 and r.json() == {"status": "accepted", "deliveries": 2}
    wait_for(lambda: service.outbox.counts()["delivered"] == 2, what="delivery to phone and voice")
    assert "GpuTemperatureHigh" in sims.pagerduty.received[-1].text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                                     {"Authorization": "Basic dXNlcjpwYXNz"}])
def test_missing_or_wrong_credentials_get_401_and_nothing_is_stored(service, headers):
    r = post(service, webhook(), headers=headers)
    assert r.status_code == 401
    assert sum(service.outbox.counts().values()) == 0
    assert TOKEN not in r.text


def test_basic_auth_from_the_spec(sims, tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFIER_PW", "s3cret-pw")
    data = spec_data(sims)
    data["notifier"] = {"basic_auth_user": "am", "basic_auth_password": "${NOTIFIER_PW}"}
    from inferwatch.spec import spec_from_dict

    svc = NotifierService(spec_from_dict(data), tmp_path, port=0).start()
    try:
        assert requests.post(svc.url + "/alerts", json=webhook(), auth=("am", "s3cret-pw")).status_code == 200
        assert requests.post(svc.url + "/alerts", json=webhook("Other"), auth=("am", "nope")).status_code == 401
    finally:
        svc.stop()


def test_body_over_the_limit_gets_413(service):
    big = webhook(description="x" * 70_000)
    assert post(service, big).status_code == 413
    r = requests.post(service.url + "/alerts", data=(b"x" * 70_000 for _ in range(1)), headers=AUTH)  # chunked
    assert r.status_code == 413
    assert sum(service.outbox.counts().values()) == 0


@pytest.mark.parametrize("raw, says", [
    (b"{", "not JSON"), (b"[]", "expected a JSON object"), (b'{"version": "3"}', "version"),
    (json.dumps({**webhook(), "alerts": []}).encode(), "alerts"),
    (json.dumps({**webhook(), "status": "burning"}).encode(), "status"),
    (json.dumps({**webhook(), "groupKey": 7}).encode(), "groupKey"),
    (json.dumps({**webhook(), "alerts": [{"status": "firing", "labels": None}]}).encode(), "alerts[0].labels"),
    (json.dumps({**webhook(), "alerts": [{"status": "firing", "labels": {"alertname": 1}}]}).encode(),
     "alerts[0].labels.alertname"),
    (b"\xff\xfe", "not JSON"), (b"[" * 100_00 + b"]" * 100_00, "JSON"),
])
def test_malformed_payloads_get_400_saying_what_is_wrong(service, raw, says):
    r = post(service, None, raw=raw)
    assert r.status_code == 400
    assert says in r.json()["error"]


def test_redelivered_webhooks_are_sent_once(service, sims):
    body = webhook("TritonServerDown", "L2", n=2)
    before = len(sims.slack.received)
    first = post(service, body)
    # An HA peer sends the same notification with other key order and formatting.
    peer = json.loads(json.dumps(body))
    peer["alerts"].reverse()
    second = requests.post(service.url + "/alerts", data=json.dumps(peer, indent=2), headers=AUTH)
    third = post(service, body)
    assert first.json()["status"] == "accepted"
    assert second.json()["status"] == third.json()["status"] == "duplicate"
    wait_for(lambda: len(sims.slack.received) > before, what="the Slack message")
    wait_for(lambda: service.outbox.counts()["pending"] == 1, what="only the escalation left pending")
    assert len(sims.slack.received) == before + 1


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=20)


def _mutations():
    base = webhook("FuzzTarget", "L2")
    keys = list(base) + ["alerts.0.labels", "alerts.0.status", "alerts.0.annotations", "alerts.0"]
    return st.tuples(st.sampled_from(keys), json_values)


@given(mutation=_mutations())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_payloads_get_4xx_or_2xx_never_5xx_and_never_lose_an_earlier_alert(service, mutation):
    if not service.outbox.counts()["pending"] + service.outbox.counts()["delivered"]:
        assert post(service, webhook("EarlierAlert", "L3")).status_code == 200
    path, value = mutation
    body = webhook("FuzzTarget", "L2")
    target = body
    parts = path.split(".")
    for p in parts[:-1]:
        target = target[int(p)] if p.isdigit() else target[p]
    last = parts[-1]
    target[int(last) if last.isdigit() else last] = value
    r = post(service, body)
    assert r.status_code in (200, 400), r.text
    earlier = [d for d in service.outbox.list(("pending", "delivered"), 10_000) if "EarlierAlert" in d.group_key]
    assert earlier
    assert requests.get(service.url + "/-/healthy").status_code == 200


@given(raw=st.binary(max_size=2000))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_bytes_get_400(service, raw):
    assert post(service, None, raw=raw).status_code == 400


def test_outbox_failure_answers_503_so_alertmanager_retries_and_ready_follows(sqlite_service, monkeypatch):
    service = sqlite_service
    def broken(*a, **k):  # every write transaction fails as SQLite's does on a failing disk
        raise sqlite3.OperationalError("disk I/O error")

    assert requests.get(service.url + "/-/ready").status_code == 200
    monkeypatch.setattr(service.outbox, "_tx", broken)
    r = post(service, webhook())
    assert r.status_code == 503
    ready = requests.get(service.url + "/-/ready")
    assert ready.status_code == 503 and "disk I/O error" in ready.text
    text = requests.get(service.url + "/metrics").text
    assert "inferwatch_notifier_outbox_writable 0.0" in text
    assert 'inferwatch_notifier_outbox_write_errors_total{operation="intake"} 1.0' in text
    assert 'inferwatch_notifier_webhooks_total{outcome="unavailable"} 1.0' in text
    monkeypatch.undo()
    wait_for(lambda: requests.get(service.url + "/-/ready").status_code == 200, what="ready after a good probe")
    assert post(service, webhook()).status_code == 200


def test_unwritable_outbox_is_reported_as_outbox_error(tmp_path):
    from inferwatch.notifier.outbox import Outbox

    ob = Outbox(tmp_path / "o.sqlite3")
    ob._db().execute("PRAGMA query_only=ON")
    with pytest.raises(OutboxError):
        from inferwatch.notifier.model import message_from_dict

        ob.accept(message_from_dict(webhook()), [])


def test_metrics_series_exist_at_zero_and_count_deliveries(service):
    text = requests.get(service.url + "/metrics").text
    assert 'inferwatch_notifier_notifications_total{channel="llm-wecom",outcome="delivered"} 0.0' in text
    assert 'inferwatch_notifier_dead_letters_total{channel="phone",reason="bad_key"} 0.0' in text
    assert "inferwatch_notifier_outbox_depth 0.0" in text
    assert "inferwatch_notifier_oldest_pending_age_seconds 0.0" in text
    post(service, webhook("X", "L3"))
    wait_for(lambda: 'outcome="delivered"} 1.0' in requests.get(service.url + "/metrics").text, what="metric")
    assert 'inferwatch_notifier_delivery_duration_seconds_count{channel="llm-wecom"} 1.0' in \
        requests.get(service.url + "/metrics").text


# -------------------------------------------------------------------------------------------- routing
def test_routes_by_layer_with_continue_and_per_model_owners(sims):
    router = Router(make_spec(sims))
    assert router.receivers({"layer": "L1"}) == ["phone", "call"]
    assert router.receivers({"layer": "L2", "severity": "warning"}) == ["oncall-slack"]
    assert router.receivers({"layer": "L3", "model": "owned"}) == ["owners-wecom", "llm-wecom"]
    assert router.receivers({"layer": "L3", "model": "other"}) == ["llm-wecom"]
    assert router.match({"severity": "critical"}) == []  # no route: the catch-all takes it (test_notifier_unrouted)


def test_default_routes_go_by_layer_when_the_spec_has_none(sims):
    data = spec_data(sims)
    del data["routes"]
    from inferwatch.spec import spec_from_dict

    router = Router(spec_from_dict(data))
    assert [router.receivers({"layer": x}) for x in ("L1", "L2", "L3")] == [["phone"], ["oncall-slack"], ["llm-wecom"]]


def test_routes_test_command_prints_receivers(capsys):
    spec = str(REPO_ROOT / "inferwatch.yaml")
    assert main(["notifier", "--spec", spec, "routes", "test", "layer=L2", "severity=critical"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "oncall-slack" and "escalates to phone" in out
    assert main(["notifier", "routes", "test", "--spec", spec, "layer=L1", "--verify", "phone"]) == 0
    assert main(["notifier", "routes", "test", "--spec", spec, "layer=L3", "--verify", "phone"]) == 1
    assert main(["notifier", "routes", "test", "--spec", spec, "novalue"]) == 2


def test_l2_alert_still_firing_escalates_to_phone_and_resolve_closes_it(service, sims):
    body = webhook("TritonModelNotReady", "L2", group="esc-group")
    assert post(service, body).json()["deliveries"] == 2  # Slack now, phone after escalate_after (2s)
    wait_for(lambda: any("[ESCALATED]" in t and "TritonModelNotReady" in t for t in sims.pagerduty.texts()),
             what="the escalation to phone")
    assert post(service, webhook("TritonModelNotReady", "L2", group="esc-group", status="resolved")).ok
    wait_for(lambda: sims.pagerduty.received[-1].body["event_action"] == "resolve", what="PagerDuty resolve")


def test_resolved_before_escalation_cancels_it(service, sims):
    post(service, webhook("TritonQueueTimeP95High", "L2", group="short-lived"))
    post(service, webhook("TritonQueueTimeP95High", "L2", group="short-lived", status="resolved"))
    wait_for(lambda: service.outbox.counts()["cancelled"] == 1, what="the escalation cancelled")
    assert not any("TritonQueueTimeP95High" in t for t in sims.pagerduty.texts())


def test_voice_gets_firing_only(service, sims):
    calls = len(sims.voice.received)  # the simulators are the module's: earlier tests' calls stay there
    post(service, webhook("GpuLost", "L1", group="g-voice"))
    post(service, webhook("GpuLost", "L1", group="g-voice", status="resolved"))
    wait_for(lambda: service.outbox.counts()["pending"] == 0 and service.outbox.counts()["delivered"] == 3,
             what="two PagerDuty events and one call")
    assert [r.body.get("alertname") for r in sims.voice.received[calls:]].count("GpuLost") == 1


# ---------------------------------------------------------------------------------- outbox commands
def test_dead_letter_is_listed_and_replayed_by_the_outbox_command(sqlite_service, sims, capsys, tmp_path):
    service = sqlite_service
    sims.slack.set_mode("bad_key")
    post(service, webhook("TritonCanaryRegression", "L2", group="dead-one", severity="warning"))
    wait_for(lambda: service.outbox.counts()["dead"] == 1, what="the dead letter")
    dead = service.outbox.list(("dead",))[0]
    assert dead.last_reason == "bad_key" and "invalid_token" in dead.last_error
    data_dir = str(service.outbox.path.parent)
    spec = str(REPO_ROOT / "inferwatch.yaml")
    assert main(["notifier", "outbox", "list", "--spec", spec, "--data-dir", data_dir]) == 0
    out = capsys.readouterr().out
    assert f"{dead.id:>6}  dead" in out and "[bad_key]" in out and "dead-one" in out
    sims.slack.set_mode("ok")
    assert main(["notifier", "--data-dir", data_dir, "outbox", "retry", str(dead.id), "--spec", spec]) == 0
    wait_for(lambda: service.outbox.get(dead.id).state == "delivered", what="the replayed delivery")
    assert "TritonCanaryRegression" in sims.slack.received[-1].text
    assert main(["notifier", "outbox", "retry", "999999", "--data-dir", data_dir, "--spec", spec]) == 2


def test_metrics_are_served_by_prometheus_client_with_negotiation_and_gzip(service):
    import gzip

    plain = requests.get(service.url + "/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "inferwatch_notifier_outbox_writable 1.0" in plain.text
    om = requests.get(service.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                                        "Accept-Encoding": "identity"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    raw = requests.get(service.url + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True).raw
    assert raw.headers["Content-Encoding"] == "gzip"
    assert b"inferwatch_notifier_outbox_writable" in gzip.decompress(raw.read(decode_content=False))
    only = requests.get(service.url + "/metrics?name[]=inferwatch_notifier_outbox_depth").text
    assert "inferwatch_notifier_outbox_depth" in only and "inferwatch_notifier_webhooks_total" not in only


def _changed(body: dict, change) -> dict:
    copy = json.loads(json.dumps(body))
    change(copy)
    return copy


# What makes a webhook a new notification, as Alertmanager's own DedupStage decides it (the sets of firing and
# resolved alerts by fingerprint; annotations are not compared, HA peers' copies differ in `$value`).
SAME_OR_NEW = [
    ("an annotation differs (a peer's $value)", lambda b: b["alerts"][0]["annotations"].update(description="95.2"),
     "duplicate"),
    ("commonAnnotations differ", lambda b: b["commonAnnotations"].update(summary="other"), "duplicate"),
    ("externalURL differs (the other peer)", lambda b: b.update(externalURL="http://am-1:9093"), "duplicate"),
    ("truncatedAlerts differs", lambda b: b.update(truncatedAlerts=3), "duplicate"),
    ("an alert resolved", lambda b: b["alerts"][0].update(status="resolved", endsAt="2030-01-01T00:00:00Z"),
     "accepted"),
    ("an alert more", lambda b: b["alerts"].append({**b["alerts"][0], "fingerprint": "00000000000000ff"}),
     "accepted"),
    ("an alert fired again (new start)", lambda b: b["alerts"][0].update(startsAt="2031-01-01T00:00:00Z"),
     "accepted"),
    ("another receiver", lambda b: b.update(receiver="notifier-other"), "accepted"),
]


@pytest.mark.parametrize("change, answer", [(c, a) for _, c, a in SAME_OR_NEW], ids=[r for r, _, _ in SAME_OR_NEW])
def test_a_webhook_is_a_duplicate_exactly_when_alertmanager_would_not_notify_again(service, change, answer):
    body = webhook("DedupTable", "L2", n=2, group=f"dedup-{uuid.uuid4()}")
    assert post(service, body).json()["status"] == "accepted"
    assert post(service, _changed(body, change)).json()["status"] == answer
