"""Hostile and oversized input at the intake: nothing Alertmanager may send is refused, nothing ever answers
5xx for input, and every refusal is logged and counted.

- Oversized values (a pasted stack trace as description) are accepted, cut with a marker saying how much
  was cut, and the page is sent.
- The whole kind of input that used to answer 500 (a lone surrogate, truncatedAlerts of 2^63-1, wrong JSON
  types, huge or non-finite numbers, invalid UTF-8, deep nesting): a table over real HTTP, each row with
  its right answer, plus a property test of the parser and the outbox over generated payloads.
- Every refusal path (401, 408, 413, 400, 404, 405, HTTP parser errors): one log line and a counter.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import tempfile
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.notifier.model import (
    MAX_ALERTS,
    MAX_LABELS,
    MAX_VALUE_CHARS,
    NOTE_ANNOTATION,
    PayloadError,
    Repair,
    message_from_dict,
    parse_webhook,
)
from inferwatch.notifier.outbox import SQLITE_INT_MAX, Outbox
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, make_spec, wait_for, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


@pytest.fixture
def service(sims, tmp_path):
    sims.set_mode("ok")
    svc = NotifierService(make_spec(sims, max_body_bytes=1024 * 1024), tmp_path / "data", port=0).start()
    yield svc
    svc.stop()


def post_raw(svc, raw: bytes, path: str = "/alerts", headers=AUTH):
    return requests.post(svc.url + path, data=raw, headers={**headers, "Content-Type": "application/json"},
                         timeout=10)


def metric(svc, line_start: str) -> float:
    for line in requests.get(svc.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {line_start}")


def stored_bodies(svc) -> list[dict]:
    db = sqlite3.connect(svc.outbox.path)
    try:
        return [json.loads(r[0]) for r in db.execute("SELECT body FROM messages ORDER BY id")]
    finally:
        db.close()


# ------------------------------------------------------------------------------- the oversized alert
def test_a_100000_character_description_is_accepted_cut_with_a_marker_and_the_page_is_sent(service, sims, caplog):
    caplog.set_level(logging.WARNING, logger="inferwatch.notifier.service")
    trace = "Traceback (most recent call last):\n" + "  File \"x.py\", line 1, in f\n" * 3500
    trace = (trace + "x" * 100_000)[:100_000]
    body = webhook("GpuXidCritical", "L1", description=trace)
    r = post_raw(service, json.dumps(body).encode())
    assert r.status_code == 200 and r.json()["status"] == "accepted"
    description = stored_bodies(service)[-1]["alerts"][0]["annotations"]["description"]
    cut = 100_000 - description.index(" …[cut")
    print(f"\n100,000-character description: answered {r.status_code}, stored {len(description):,} characters "
          f"ending {description[-40:]!r}")
    assert len(description) <= MAX_VALUE_CHARS
    assert description.startswith(trace[:MAX_VALUE_CHARS - 100])
    assert description.endswith(f" …[cut {cut:,} of 100,000 characters]")
    wait_for(lambda: any("GpuXidCritical" in t for t in sims.pagerduty.texts()), what="the page")
    assert metric(service, 'inferwatch_notifier_webhook_repairs_total{kind="value_cut"}') == 1
    lines = [r.getMessage() for r in caplog.records if "value_cut" in r.getMessage()]
    assert len(lines) == 1 and "alerts[0].annotations.description" in lines[0] and "100,000" in lines[0]


# --------------------------------------------------------------------- the kind that answered 500
def _with(path: str, value) -> bytes:
    body = webhook("HostileInput", "L2")
    target = body
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    target[int(last) if last.isdigit() else last] = value
    return json.dumps(body).encode()


def _raw_with(path: str, literal: str) -> bytes:
    """A body whose field `path` is the JSON text `literal` (values json.dumps cannot write, e.g. a lone
    surrogate escape or a 5,000-digit integer)."""
    marker = "@@LITERAL@@"
    return _with(path, marker).replace(json.dumps(marker).encode(), literal.encode())


# (id, body, expected status, check on the answer's error (400) or on the stored message (200))
HOSTILE = [
    ("lone surrogate in an annotation", _raw_with("alerts.0.annotations.description", '"a\\ud800b"'), 200,
     lambda m: m["alerts"][0]["annotations"]["description"] == "a\ufffdb"),
    ("lone low surrogate in a label value", _raw_with("alerts.0.labels.model", '"\\udfff"'), 200,
     lambda m: m["alerts"][0]["labels"]["model"] == "\ufffd"),
    ("lone surrogate in a label name", _raw_with("alerts.0.labels", '{"alertname": "HostileInput", "\\ud800": "x"}'),
     200, lambda m: m["alerts"][0]["labels"]["\ufffd"] == "x"),
    ("a valid surrogate pair is kept", _raw_with("alerts.0.annotations.summary", '"\\ud83d\\ude80"'), 200,
     lambda m: m["alerts"][0]["annotations"]["summary"] == "\U0001F680"),
    ("invalid UTF-8 in a value", _with("alerts.0.annotations.summary", "@X@").replace(b"@X@", b"bad \xff\xfe byte"),
     200, lambda m: m["alerts"][0]["annotations"]["summary"] == "bad \ufffd\ufffd byte"),
    ("truncatedAlerts 2^63-1", _with("truncatedAlerts", 2**63 - 1), 200,
     lambda m: m["truncatedAlerts"] == 2**63 - 1),
    ("truncatedAlerts 2^64-1 (Go uint64 max)", _with("truncatedAlerts", 2**64 - 1), 200,
     lambda m: m["truncatedAlerts"] == 2**64 - 1),
    ("truncatedAlerts 2^64 (beyond a uint64: not from Alertmanager)", _with("truncatedAlerts", 2**64), 400,
     lambda e: "truncatedAlerts" in e and "2^64-1" in e),
    ("truncatedAlerts 10^30", _with("truncatedAlerts", 10**30), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts -1", _with("truncatedAlerts", -1), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts 1.5", _with("truncatedAlerts", 1.5), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts as a string", _with("truncatedAlerts", "12"), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts true", _with("truncatedAlerts", True), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts 1e400 (infinite)", _raw_with("truncatedAlerts", "1e400"), 400, lambda e: "truncatedAlerts" in e),
    ("truncatedAlerts NaN", _raw_with("truncatedAlerts", "NaN"), 400, lambda e: "truncatedAlerts" in e),
    ("a 5,000-digit integer", _raw_with("truncatedAlerts", "9" * 5000), 400, lambda e: "not JSON" in e),
    ("a label value that is a number", _with("alerts.0.labels.model", 7), 400,
     lambda e: "alerts[0].labels.model" in e),
    ("a label value that is an object", _with("alerts.0.labels.model", {"a": 1}), 400,
     lambda e: "alerts[0].labels.model" in e),
    ("annotations as a list", _with("alerts.0.annotations", ["x"]), 400, lambda e: "alerts[0].annotations" in e),
    ("startsAt as a number", _with("alerts.0.startsAt", 1700000000), 400, lambda e: "alerts[0].startsAt" in e),
    ("an alert that is a string", _with("alerts.0", "boom"), 400, lambda e: "alerts[0]" in e),
    ("nested annotation", _raw_with("alerts.0.annotations.summary", "[" * 50 + "]" * 50), 400,
     lambda e: "alerts[0].annotations.summary" in e),
    ("annotation nested deeper than the JSON parser goes", _raw_with("alerts.0.annotations.summary",
                                                                      "[" * 5000 + "]" * 5000), 400,
     lambda e: "nested too deeply" in e),
    ("deeply nested body", b"[" * 100_000 + b"]" * 100_000, 400, lambda e: "JSON" in e),
    ("status unknown", _with("status", "burning"), 400,
     lambda e: e.startswith("malformed Alertmanager webhook: status")),
    ("version 3", _with("version", "3"), 400, lambda e: "version" in e),
    ("no alertname (Alertmanager's API allows it)", _with("alerts.0.labels", {"job": "x"}), 200,
     lambda m: m["alerts"][0]["labels"] == {"job": "x"}),
    ("annotations null", _with("alerts.0.annotations", None), 200, lambda m: m["alerts"][0]["annotations"] == {}),
    (f"{MAX_LABELS + 44} labels", _with("alerts.0.labels", {"alertname": "HostileInput",
                                                         **{f"l{i}": "v" for i in range(MAX_LABELS + 43)}}), 200,
     lambda m: len(m["alerts"][0]["labels"]) == MAX_LABELS
     and "44 of 300 labels dropped" in m["alerts"][0]["annotations"][NOTE_ANNOTATION]),
    ("a 1 MB label value", _with("alerts.0.labels.model", "m" * 900_000), 200,
     lambda m: m["alerts"][0]["labels"]["model"].endswith("of 900,000 characters]")),
]


@pytest.mark.parametrize("body, status, check", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_values_get_400_naming_the_field_or_are_accepted_made_safe_never_500(service, body, status, check):
    r = post_raw(service, body)
    assert r.status_code == status, r.text
    if status == 400:
        assert check(r.json()["error"]), r.json()
        assert metric(service, 'inferwatch_notifier_webhooks_total{outcome="malformed"}') == 1
    else:
        assert check(stored_bodies(service)[-1]), stored_bodies(service)[-1]
        assert metric(service, 'inferwatch_notifier_webhooks_total{outcome="accepted"}') == 1
    assert requests.get(service.url + "/-/ready").status_code == 200


def test_truncated_alerts_2_63_minus_1_is_delivered_with_its_count(service, sims):
    body = json.loads(_with("truncatedAlerts", 2**63 - 1))
    body["groupKey"] = "huge-truncated"
    assert post_raw(service, json.dumps(body).encode()).status_code == 200
    row = wait_for(lambda: next((d for d in service.outbox.list(("pending", "delivered"), 10) if
                                 d.group_key == "huge-truncated"), None), what="the stored delivery")
    assert row.alerts == SQLITE_INT_MAX  # 1 alert + 2^63-1 truncated, clamped to SQLite's INTEGER
    wait_for(lambda: service.outbox.counts()["delivered"] >= 1, what="delivery to Slack")
    assert any("HostileInput" in t for t in sims.slack.texts())


def test_more_alerts_than_kept_are_counted_as_truncated():
    body = webhook("Many", "L2", n=MAX_ALERTS + 5)
    repairs: list[Repair] = []
    m = parse_webhook(json.dumps(body).encode(), repairs)
    assert len(m.alerts) == MAX_ALERTS and m.truncated_alerts == 5 and m.alert_count() == MAX_ALERTS + 5
    assert [r.kind for r in repairs] == ["alerts_dropped"]


# -------------------------------------------------------------------------------- property test
_hostile_text = st.text(st.characters(blacklist_categories=()) | st.sampled_from("\ud800\udbff\udc00\udfff\x00"),
                        max_size=30)
_numbers = st.integers() | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30]) | \
    st.floats(allow_nan=True, allow_infinity=True)
_json = st.recursive(st.none() | st.booleans() | _numbers | _hostile_text,
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(_hostile_text, c, max_size=3), max_leaves=12)
_FIELDS = ["truncatedAlerts", "status", "groupKey", "receiver", "externalURL", "groupLabels", "commonLabels",
           "commonAnnotations", "alerts", "alerts.0", "alerts.0.labels", "alerts.0.annotations", "alerts.0.status",
           "alerts.0.startsAt", "alerts.0.labels.model", "alerts.0.annotations.description",
           "alerts.0.generatorURL", "version"]


@given(field=st.sampled_from(_FIELDS), value=_json)
@settings(max_examples=300, deadline=None)
def test_any_value_in_any_field_is_refused_with_payload_error_or_parsed_and_storable(field, value):
    body = webhook("Property", "L2")
    target = body
    keys = field.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    target[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
    data = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()  # writes lone surrogates as \udXXX
    try:
        message = parse_webhook(data)
    except PayloadError as exc:
        assert str(exc).split(":", 1)[0], exc
        return
    with tempfile.TemporaryDirectory() as tmp:
        outbox = Outbox(Path(tmp) / "o.sqlite3")
        try:
            assert outbox.accept(message, [])[0]
            assert outbox.messages([1])[1].delivery_key() == message.delivery_key()
        finally:
            outbox.close()


def test_stored_messages_parse_back_unchanged():
    body = json.loads(_raw_with("alerts.0.annotations.description", '"x\\ud800"'))
    m = message_from_dict(body)
    again = message_from_dict(json.loads(json.dumps(m.to_json(), ensure_ascii=False)))
    assert again == m


# ------------------------------------------------------------------------ every refusal: log + counter
def _raw_socket(svc, data: bytes) -> bytes:
    with socket.create_connection((svc.host, svc.port), timeout=10) as s:
        s.sendall(data)
        return s.recv(1024)


REFUSALS = [
    ("no credentials", lambda s: requests.post(s.url + "/alerts", json=webhook(), timeout=10), 401, "unauthorized"),
    ("wrong token", lambda s: requests.post(s.url + "/alerts", json=webhook(), timeout=10,
                                            headers={"Authorization": "Bearer nope"}), 401, "unauthorized"),
    ("Content-Length over the limit", lambda s: post_raw(s, b"x" * (1024 * 1024 + 1)), 413, "too_large"),
    ("chunked body over the limit", lambda s: requests.post(s.url + "/alerts", headers=AUTH, timeout=10,
                                                            data=iter([b"x" * (1024 * 1024 + 1)])), 413, "too_large"),
    ("not JSON", lambda s: post_raw(s, b"{"), 400, "malformed"),
    ("not an Alertmanager webhook", lambda s: post_raw(s, b'{"text": "hello"}'), 400, "malformed"),
    ("wrong path", lambda s: post_raw(s, json.dumps(webhook()).encode(), path="/api/v2/alerts"), 404,
     "wrong_endpoint"),
    ("wrong method", lambda s: requests.get(s.url + "/alerts", headers=AUTH, timeout=10), 405, "wrong_endpoint"),
    ("garbage request line", lambda s: int(_raw_socket(s, b"\x16\x03\x01\x02\x00 not http\r\n\r\n").split()[1]),
     400, "malformed"),
]


@pytest.mark.parametrize("send, status, outcome", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_every_refusal_is_logged_with_its_reason_and_counted(service, caplog, send, status, outcome):
    caplog.set_level(logging.INFO)
    before = metric(service, f'inferwatch_notifier_webhooks_total{{outcome="{outcome}"}}')
    answer = send(service)
    assert (answer if isinstance(answer, int) else answer.status_code) == status
    assert metric(service, f'inferwatch_notifier_webhooks_total{{outcome="{outcome}"}}') == before + 1
    lines = [r for r in caplog.records if f"({outcome})" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in caplog.records]
    assert "nope" not in lines[0].getMessage()


def test_a_flood_of_refusals_is_one_line_a_minute_and_every_one_counted(service, caplog):
    caplog.set_level(logging.INFO)
    for _ in range(50):
        assert post_raw(service, b'{"version": "3"}').status_code == 400
    assert metric(service, 'inferwatch_notifier_webhooks_total{outcome="malformed"}') == 50
    assert len([r for r in caplog.records if "(malformed)" in r.getMessage()]) == 1
