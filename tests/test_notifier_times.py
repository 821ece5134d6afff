"""Alertmanager's times (RFC 3339 as Go's RFC3339Nano writes them) are parsed fully: offsets, nanoseconds,
`Z`, Go's zero time; escalation falls due at startsAt + escalate_after whatever the offset."""

from __future__ import annotations

import calendar
import json

import pytest
import requests

from inferwatch.notifier.intake import plan
from inferwatch.notifier.model import message_from_dict, parse_time
from inferwatch.notifier.routing import Router
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, make_spec, webhook


def utc(y, mo, d, h, mi, s, micro=0) -> float:
    return calendar.timegm((y, mo, d, h, mi, s)) + micro / 1e6


# (RFC 3339 text, epoch seconds) — one row per form.
FORMS = [
    ("2026-03-02T09:15:00.123456789+08:00", utc(2026, 3, 2, 1, 15, 0, 123456)),   # the example
    ("2026-03-02T09:15:00-05:00", utc(2026, 3, 2, 14, 15, 0)),                     # negative offset
    ("2026-03-02T09:15:00Z", utc(2026, 3, 2, 9, 15, 0)),                           # Z
    ("2026-03-02T09:15:00.5z", utc(2026, 3, 2, 9, 15, 0, 500000)),                 # lower-case t/z allowed
    ("2026-03-02t09:15:00.000000001Z", utc(2026, 3, 2, 9, 15, 0)),                 # 1 ns: below a float's reach
    ("2026-03-02T09:15:00.999999999+00:00", utc(2026, 3, 2, 9, 15, 0, 999999)),   # nanoseconds truncated
    ("2026-03-02T09:15:00+05:45", utc(2026, 3, 2, 3, 30, 0)),                      # Nepal: minutes count too
    ("2026-03-02T00:15:00+08:00", utc(2026, 3, 1, 16, 15, 0)),                     # crosses the date
    ("2026-03-02T09:15:00-00:00", utc(2026, 3, 2, 9, 15, 0)),                      # unknown local offset
    ("1970-01-01T00:00:00Z", 0.0),
]
UNKNOWN = [
    "0001-01-01T00:00:00Z",        # Go's zero time: Alertmanager's "not set"
    "0001-01-01T00:00:00+00:00",
    "", "soon", "2026-03-02", "2026-03-02T09:15Z",  # no seconds: not RFC 3339
    "2026-03-02T09:15:00",         # no offset: local time of whom? unknown, not UTC
    "2026-03-02T09:15:00+0800",    # offset without colon: ISO 8601 basic, not RFC 3339
    "2026-13-02T09:15:00Z", "2026-03-02T25:15:00Z", "2026-03-02T09:15:00+24:00",
]


@pytest.mark.parametrize("text, epoch", FORMS, ids=[f[0] for f in FORMS])
def test_rfc3339_forms(text, epoch):
    assert parse_time(text) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize("text", UNKNOWN)
def test_unparsable_and_zero_times_are_unknown_not_a_date(text):
    assert parse_time(text) is None


def _message(starts_at: str):
    body = webhook("TritonModelNotReady", "L2", group="tz")
    body["alerts"][0]["startsAt"] = starts_at
    return message_from_dict(body)


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


ESCALATE_AFTER = 2.0  # notifier_support: L2 escalates to phone after 2s
NOW = utc(2026, 3, 2, 1, 15, 1)  # one second after the startsAt


@pytest.mark.parametrize("starts_at, due", [
    ("2026-03-02T09:15:00.123456789+08:00", utc(2026, 3, 2, 1, 15, 0, 123456) + ESCALATE_AFTER),
    ("2026-03-01T20:15:00-05:00", utc(2026, 3, 2, 1, 15, 0) + ESCALATE_AFTER),
    ("2026-03-02T01:15:00Z", utc(2026, 3, 2, 1, 15, 0) + ESCALATE_AFTER),
    ("0001-01-01T00:00:00Z", NOW + ESCALATE_AFTER),   # unknown start: counted from now
    ("garbage", NOW + ESCALATE_AFTER),
])
def test_escalation_falls_due_at_starts_at_plus_escalate_after_whatever_the_offset(sims, starts_at, due):
    spec = make_spec(sims)
    planned = plan(spec, Router(spec), _message(starts_at), NOW)
    escalation = [p for p in planned if p.kind == "escalation"]
    assert [p.channel for p in escalation] == ["phone"]
    assert escalation[0].not_before == pytest.approx(due, abs=1e-6)


def test_offset_start_time_is_stored_as_the_escalation_due_time(sims, tmp_path):
    """Over HTTP: +08:00 is not read as UTC (the escalation would be 8 hours late) nor dropped."""
    svc = NotifierService(make_spec(sims, retry_initial="1h"), tmp_path / "data", port=0).start()
    try:
        sims.set_mode("down")  # keep the rows pending so they can be read back
        body = webhook("TritonModelNotReady", "L2", group="tz-http")
        body["alerts"][0]["startsAt"] = "2099-03-02T09:15:00.123456789+08:00"
        r = requests.post(svc.url + "/alerts", data=json.dumps(body), headers=AUTH, timeout=10)
        assert r.status_code == 200
        esc = [d for d in svc.outbox.list(("pending",)) if d.kind == "escalation"]
        assert len(esc) == 1
        assert esc[0].next_attempt_at == pytest.approx(utc(2099, 3, 2, 1, 15, 0, 123456) + ESCALATE_AFTER, abs=1e-5)
    finally:
        sims.set_mode("ok")
        svc.stop()
