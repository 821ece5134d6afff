"""A provider that says "too long" below what we rendered: the notifier keeps shrinking, remembers the size
that worked, and delivers within three attempts with every alert named. And every error answer from any
provider is one log line without secrets plus `inferwatch_notifier_send_errors_total{channel,reason}`.
Real HTTP: Alertmanager-shaped POSTs to a running notifier, simulators answering as the providers do.
"""

from __future__ import annotations

import logging
import re

import pytest
import requests

from inferwatch.notifier.service import NotifierService
from inferwatch.testing.channels import ProviderSimulators
from notifier_support import AUTH, TOKEN, make_spec, wait_for, webhook


@pytest.fixture
def sims():
    with ProviderSimulators() as s:
        yield s


def post(svc, body):
    r = requests.post(svc.url + "/alerts", json=body, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text


def metric(svc, name: str, **labels) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in requests.get(svc.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name}{{{want}}}")


def twelve_alerts(name: str, layer: str) -> dict:
    # One group of 12 alerts, each with a 1,600-character description (the input).
    return webhook(name, layer, n=12, group=f"too-long-{name}", severity="warning",
                   description="The queue is backing up. " * 64)


def named(provider, text_of) -> set[str]:
    return set(re.findall(r"\bi(\d+)\b", text_of(provider.received[-1])))


# channel, layer, provider, limit attribute, limit, what a delivered message names the alerts in
TOO_LONG = [
    ("oncall-slack", "L2", "slack", "max_total_chars", 12_000, lambda r: r.text),   # the example
    ("oncall-slack", "L2", "slack", "max_total_chars", 3_000, lambda r: r.text),
    ("llm-wecom", "L3", "wecom", "max_markdown_bytes", 1_200, lambda r: r.text),    # errcode 40058
    ("phone", "L1", "pagerduty", "max_event_bytes", 8_000,
     lambda r: " ".join(a["labels"]["instance"] for a in r.body["payload"]["custom_details"]["firing"])),
]


@pytest.mark.parametrize("channel, layer, provider, attr, limit, text_of", TOO_LONG,
                         ids=[f"{row[2]}-{row[4]}" for row in TOO_LONG])
def test_a_too_long_answer_below_half_size_is_met_within_three_attempts(sims, tmp_path, caplog, channel, layer,
                                                                       provider, attr, limit, text_of):
    prov = getattr(sims, provider)
    setattr(prov, attr, limit)
    svc = NotifierService(make_spec(sims, retry_initial="100ms", retry_max="200ms"), tmp_path / "d", port=0).start()
    try:
        with caplog.at_level(logging.INFO):
            post(svc, twelve_alerts("QueueBacklog", layer))
            wait_for(lambda: prov.received, what="delivery")
        assert prov.attempts <= 3, prov.rejected
        assert named(prov, text_of) == {str(i) for i in range(12)}  # every alert named in what was delivered
        failed = prov.attempts - 1
        assert metric(svc, "inferwatch_notifier_send_errors_total", channel=channel, reason="too_long") == failed
        lines = [r for r in caplog.records if r.name.endswith("channels.base") and "too_long" in r.getMessage()]
        assert len(lines) == failed and all(channel in r.getMessage() for r in lines)
        # The size that worked is remembered: the next group goes through at the first attempt.
        before = prov.attempts
        post(svc, twelve_alerts("QueueBacklogAgain", layer))
        wait_for(lambda: len(prov.received) == 2, what="the second delivery")
        assert prov.attempts == before + 1
    finally:
        svc.stop()


SECRETS = ("R" * 32, "00000000-0000-4000-8000-000000000000", "XXXXXXXXXXXXXXXXXXXXXXXX", "voice-token-0123456789",
           TOKEN)
ERRORS = [  # simulator mode (or a too-small limit), the reason every channel reports
    ("down", "http_5xx"), ("rate_limit", "rate_limited"), ("bad_key", "bad_key"), ("too_long", "too_long"),
]


@pytest.mark.parametrize("mode, reason", ERRORS, ids=[e[0] for e in ERRORS])
def test_every_error_answer_is_logged_once_without_secrets_and_counted(sims, tmp_path, caplog, mode, reason):
    if mode == "too_long":
        sims.slack.max_total_chars = sims.wecom.max_markdown_bytes = sims.pagerduty.max_event_bytes = 10
    else:
        sims.set_mode(mode)
    channels = {"phone": sims.pagerduty, "oncall-slack": sims.slack, "llm-wecom": sims.wecom}
    if mode != "too_long":  # the voice gateway has no size limit
        channels["call"] = sims.voice
    svc = NotifierService(make_spec(sims), tmp_path / "d", port=0).start()
    running = True
    try:
        with caplog.at_level(logging.DEBUG):
            for layer, name in (("L1", "GpuLost"), ("L2", "TritonServerDown"), ("L3", "LlmTtftP95High")):
                post(svc, webhook(name, layer))
            for channel in channels:
                wait_for(lambda c=channel: metric(svc, "inferwatch_notifier_send_errors_total", channel=c,
                                                  reason=reason) >= 1, what=f"{channel} {reason} counted")
            running = False
            svc.stop()  # no more sends: the log lines and the providers' counts can be compared
        for channel, prov in channels.items():
            lines = [r for r in caplog.records if r.name.endswith("channels.base")
                     and r.getMessage().startswith(f"channel {channel} ")]
            assert lines and all(f": {reason}, " in r.getMessage() for r in lines), [r.getMessage() for r in lines]
            assert len(lines) == prov.attempts  # one line per error answer
        for secret in SECRETS:
            assert secret not in caplog.text
    finally:
        if running:
            svc.stop()
