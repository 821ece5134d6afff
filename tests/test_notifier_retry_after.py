"""A provider's Retry-After is honoured but never stops a channel for longer than `notifier.retry_max`.

A PagerDuty that answered one 429 with `Retry-After: 999999999` once scheduled its row for 2058 and paused
the whole phone channel: an unrelated page stayed pending with 0 tries. Each row of the table is one
Retry-After a provider may send (RFC 9110 §10.2.3: delta-seconds or an HTTP-date; anything else is
malformed and ignored); the real notifier (its HTTP intake, worker and outbox) sends through the PagerDuty
simulator, which throttles one page with that header; then an unrelated page must still go out, and the
throttled one is retried no later than retry_max after its 429.
"""

from __future__ import annotations

import email.utils
import logging
import time

import pytest
import requests

from inferwatch.notifier.channels.base import classify_http
from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, make_spec, wait_for, webhook

RETRY_MAX_S = 4.0
FAR_GMT = "Wed, 01 Jan 2058 00:00:00 GMT"

LONG = "long"  # asks for hours or more (urllib3's parser itself stops at 6 h): far beyond retry_max
# (row, Retry-After header, seconds it asks for after parsing: None = malformed, ignored)
ROWS = [
    ("huge delta (the report)", "999999999", LONG),
    ("HTTP-date far in the future", FAR_GMT, LONG),
    ("negative", "-5", None),
    ("not a number", "soon", None),
    ("fraction (not delta-seconds)", "2.5", None),
    ("zero", "0", 0.0),
    ("sane 3 s", "3", 3.0),
]


@pytest.mark.parametrize("header, asked", [(h, a) for _, h, a in ROWS], ids=[r for r, _, _ in ROWS])
def test_retry_after_is_parsed_as_delta_seconds_or_an_http_date_or_nothing(header, asked):
    got = classify_http(429, "", header).retry_after
    assert got >= 3600 if asked == LONG else got == asked


def test_retry_after_http_dates_count_from_now():
    assert classify_http(429, "", "Sun, 06 Nov 1994 08:49:37 GMT").retry_after == 0.0  # in the past: now
    assert classify_http(503, "", email.utils.formatdate(time.time() + 60, usegmt=True)).retry_after \
        == pytest.approx(60, abs=2)


@pytest.fixture
def sims():
    with ProviderSimulators() as s:
        yield s


@pytest.mark.parametrize("row, header, asked", ROWS, ids=[r for r, _, _ in ROWS])
def test_a_throttled_page_is_retried_within_retry_max_and_other_pages_keep_flowing(sims, tmp_path, caplog,
                                                                                    row, header, asked):
    caplog.set_level(logging.WARNING, logger="inferwatch.notifier.worker")
    svc = NotifierService(make_spec(sims, retry_initial="200ms", retry_max=f"{RETRY_MAX_S:.0f}s",
                                    max_delivery_age="6h"), tmp_path / "data", port=0).start()
    try:
        sims.pagerduty.set_mode("rate_limit")
        sims.pagerduty.retry_after = header
        post(svc, webhook("GpuXidCritical", "L1", group="throttled"))
        wait_for(lambda: _phone_row(svc, "throttled") is not None and _phone_row(svc, "throttled").attempts == 1,
                 what="the 429 recorded")
        throttled_at = sims.pagerduty.rejected[-1][0]
        first = _phone_row(svc, "throttled")
        sims.pagerduty.set_mode("ok")

        # The retry is scheduled no later than retry_max after the 429 (not in 2058), and not before the wait
        # the provider asked for when that was within retry_max.
        assert first.last_reason == "rate_limited"
        assert first.next_attempt_at <= throttled_at + RETRY_MAX_S + 1.0, (row, first.next_attempt_at - throttled_at)
        if asked not in (None, LONG):
            assert first.next_attempt_at >= throttled_at + asked
        # An unrelated page arriving now still goes out (after the channel's pause, at most retry_max), and
        # so does the throttled one.
        post(svc, webhook("GpuFellOffTheBus", "L1", group="unrelated"))
        wait_for(lambda: {"GpuXidCritical", "GpuFellOffTheBus"} <= _paged(sims), timeout=30,
                 what="both pages at PagerDuty")
        wait_for(lambda: svc.outbox.counts()["pending"] == 0, what="every outcome recorded")
        clamped = [r.getMessage() for r in caplog.records if "notifier.retry_max" in r.getMessage()]
        if asked == LONG:  # longer than retry_max (a huge delta, a far date): clamped and said so
            assert clamped and f"waiting {RETRY_MAX_S:.0f}s" in clamped[0]
        else:
            assert not clamped
    finally:
        svc.stop()


def post(svc, body):
    r = requests.post(svc.url + "/alerts", json=body, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text


def _phone_row(svc, group):
    rows = [d for d in svc.outbox.list(("pending", "delivered")) if d.channel == "phone" and d.group_key == group]
    return rows[0] if rows else None


def _paged(sims) -> set[str]:
    return {name for t in sims.pagerduty.texts() for name in ("GpuXidCritical", "GpuFellOffTheBus") if name in t}
