"""Channels against local servers answering as PagerDuty, Slack, WeCom and a voice gateway do:
content and limits per provider, a table of answers → (ok, retryable, reason), and no secret in errors.
Plus the shared helpers: HTTP classification, truncation by runes/bytes, redaction."""

from __future__ import annotations

import dataclasses
import logging
import re
from importlib.metadata import version
from urllib.parse import urlsplit, urlunsplit

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from inferwatch.notifier.channels import build_channel, channel_classes, default_rate
from inferwatch.notifier.channels.base import classify_http, redact
from inferwatch.notifier.channels.pagerduty import dedup_key
from inferwatch.notifier.channels.text import cut_bytes, cut_runes, fit_lines, utf8_len
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.notifier.service import NotifierService
from inferwatch.redaction import secret_parts
from inferwatch.spec import Secret, spec_from_dict
from inferwatch.testing.process import free_port
from notifier_support import (  # noqa: F401 - reset_sims is an autouse fixture
    AUTH,
    fixture_body,
    make_spec,
    reset_sims,
    simulators,
    spec_data,
    wait_for,
    webhook,
)


@pytest.fixture(scope="module")
def sims():
    yield from simulators()


def channel(sims, name):
    spec = make_spec(sims)
    return build_channel(name, spec.channels[name])


def note(body: dict, name: str, **kw) -> Notification:
    return Notification(channel=name, groups=[message_from_dict(body)], **kw)


# ------------------------------------------------------------------------------------- shared helpers
@pytest.mark.parametrize("status, retryable, reason", [
    (200, None, ""), (202, None, ""), (429, True, "rate_limited"), (500, True, "http_5xx"), (503, True, "http_5xx"),
    (408, True, "timeout"), (401, False, "bad_key"), (403, False, "bad_key"), (404, False, "bad_key"),
    (400, False, "invalid_payload"), (422, False, "invalid_payload"),
])
def test_http_answers_are_classified_in_one_place(status, retryable, reason):
    r = classify_http(status, "body")
    assert r.ok == (retryable is None)
    if retryable is not None:
        assert (r.retryable, r.reason) == (retryable, reason)


def test_retry_after_is_honoured():
    assert classify_http(429, "", "7").retry_after == 7.0


@given(st.text(), st.integers(min_value=0, max_value=400))
@settings(max_examples=300, deadline=None)
def test_cut_bytes_never_breaks_a_character_and_says_how_much_was_cut(text, limit):
    out = cut_bytes(text, limit)
    assert utf8_len(out) <= limit
    out.encode("utf-8")  # a lone surrogate or half character would fail here
    if utf8_len(text) <= limit:
        assert out == text
    else:
        m = re.search(r" …\[cut ([\d,]+) of ([\d,]+) characters\]$", out)
        if m:  # room for the marker: it counts exactly what is missing
            kept = out[:m.start()]
            assert text.startswith(kept)
            assert int(m.group(1).replace(",", "")) == len(text) - len(kept)
            assert int(m.group(2).replace(",", "")) == len(text)
        else:  # a limit smaller than the marker: a bare ellipsis
            assert out.endswith("…") or out == ""


@given(st.text(), st.integers(min_value=1, max_value=300))
@settings(max_examples=200, deadline=None)
def test_cut_runes_counts_code_points(text, limit):
    out = cut_runes(text, limit)
    assert len(out) <= limit
    assert out == text or out.endswith("…") or out.endswith("characters]")


def test_cut_marker_example():
    assert cut_runes("x" * 100_000, 60) == "x" * 24 + " …[cut 99,976 of 100,000 characters]"


def test_fit_lines_keeps_whole_lines_and_counts_the_rest():
    lines = [f"line {i} [link](http://x/{i})" for i in range(100)]
    text, omitted = fit_lines("head", lines, 200, lambda k: f"…and {k} more")
    assert len(text) <= 200 and omitted > 0
    assert text.endswith(f"…and {omitted} more")
    shown = [ln for ln in text.splitlines() if ln.startswith("line")]
    assert len(shown) + omitted == 100 and all(ln in lines for ln in shown)


def test_redaction_removes_keys_tokens_and_hook_paths():
    text = ("POST https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=abcd-1234 failed; "
            "https://hooks.slack.com/services/T1/B2/secretpath token=xyz R0UT1NGKEY")
    out = redact(text, ["R0UT1NGKEY"])
    for secret in ("abcd-1234", "secretpath", "xyz", "R0UT1NGKEY"):
        assert secret not in out
    assert out.count("<redacted>") == 4


# ------------------------------------------------------------------------------------------ PagerDuty
def test_pagerduty_trigger_and_resolve_share_a_stable_dedup_key(sims):
    pd = channel(sims, "phone")
    body = webhook("GpuLost", "L1", n=2, description="x" * 5000)
    assert pd.send(note(body, "phone")).ok
    event = sims.pagerduty.received[-1].body
    assert event["event_action"] == "trigger"
    assert event["dedup_key"] == dedup_key(body["groupKey"]) and len(event["dedup_key"]) <= 255
    assert len(event["payload"]["summary"]) <= 1024
    assert event["payload"]["severity"] == "critical" and event["payload"]["source"] == "node-a"
    assert {"href": "https://runbooks.example/GpuLost.md", "text": "Runbook"} in event["links"]
    assert event["dedup_key"] in sims.pagerduty.open
    resolved = webhook("GpuLost", "L1", n=2, status="resolved")
    assert pd.send(note(resolved, "phone")).ok
    assert sims.pagerduty.received[-1].body["event_action"] == "resolve"
    assert event["dedup_key"] not in sims.pagerduty.open


def test_pagerduty_summary_is_capped_at_1024_runes(sims):
    body = webhook("GpuLost", "L1")
    body["alerts"][0]["annotations"]["summary"] = "温" * 3000
    assert channel(sims, "phone").send(note(body, "phone")).ok
    assert len(sims.pagerduty.received[-1].body["payload"]["summary"]) == 1024


# ------------------------------------------------------------------------------------------------ Slack
def test_slack_blocks_have_title_key_labels_description_and_links(sims):
    body = webhook("TritonModelNotReady", "L2", n=3, extra={"model": "classifier"},
                   description="model <classifier> & v2 " + "d" * 4000)
    assert channel(sims, "oncall-slack").send(note(body, "oncall-slack")).ok
    got = sims.slack.received[-1]
    blocks = got.body["blocks"]
    assert blocks[0] == {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                                    "text": "[FIRING:3] TritonModelNotReady"}}
    assert got.body["text"] == "[FIRING:3] TritonModelNotReady"
    assert "severity: critical   layer: L2   node: node-a   model: classifier" in got.text
    alert_blocks = [b for b in blocks if b["type"] == "rich_text"][1:]
    # The last one counts what was cut: every description is (4,000 characters each).
    assert "3 of the 3 alerts shown are shortened" in str(alert_blocks.pop())
    assert len(alert_blocks) == 3 and all(len(str(b)) > 100 for b in alert_blocks)
    first = alert_blocks[0]["elements"][0]["elements"]
    # The description is one exact text element (no entities), cut with a marker saying how much.
    desc = next(e["text"] for e in first if e.get("text", "").startswith("model <classifier>"))
    assert desc.startswith("model <classifier> & v2 ddd")
    marker = next(e for e in first if "characters]" in e.get("text", ""))
    assert marker["style"] == {"italic": True}
    total = len("model <classifier> & v2 ") + 4000
    assert marker["text"] == f" …[cut {total - len(desc):,} of {total:,} characters]"
    assert got.mentions == ()
    buttons = {e["text"]["text"]: e["url"] for b in blocks if b["type"] == "actions" for e in b["elements"]}
    assert buttons == {"Runbook": "https://runbooks.example/TritonModelNotReady.md",
                       "Alertmanager": "http://alertmanager.example:9093",
                       "Prometheus": "http://prometheus.example/graph"}
    assert got.headers["User-Agent"] == f"inferwatch/{version('inferwatch')}"


def test_slack_resolved_and_many_alerts_stay_within_50_blocks_and_name_every_alert(sims):
    body = webhook("TritonQueueTimeP95High", "L2", n=120, status="resolved")
    assert channel(sims, "oncall-slack").send(note(body, "oncall-slack")).ok
    msg = sims.slack.received[-1]
    assert len(msg.body["blocks"]) <= 50
    assert "[RESOLVED:120]" in msg.text
    named = set(re.findall(r"instance=(i\d+)", msg.text))
    more = re.search(r"…and (\d+) more, see Alertmanager", msg.text)
    assert len(named) + (int(more.group(1)) if more else 0) == 120 and len(named) >= 60


def test_the_real_truncated_fixture_renders_on_every_channel(sims):
    body = fixture_body()  # one alert without annotations or generatorURL, truncatedAlerts=1
    for name in ("phone", "call", "oncall-slack", "llm-wecom"):
        assert channel(sims, name).send(note(body, name)).ok, name
    title = "[FIRING:2+] GpuTemperatureHigh L1 — at least 2 firing, 1 more not included (3 in the group)"
    assert sims.slack.received[-1].body["blocks"][0]["text"]["text"] == title
    assert "1 more alert(s) not included by Alertmanager" in sims.slack.received[-1].text
    assert title in sims.wecom.received[-1].text
    assert "1 more alert(s) not included by Alertmanager" in sims.wecom.received[-1].text
    event = sims.pagerduty.received[-1].body
    assert event["payload"]["summary"].startswith(title)
    details = event["payload"]["custom_details"]
    assert (details["num_firing"], details["num_resolved"], details["truncated_alerts"]) == (2, 0, 1)
    assert sims.voice.received[-1].body["text"].startswith(title)


# ------------------------------------------------------------------------------------------------ WeCom
def test_wecom_markdown_fits_4096_bytes_with_chinese_text_and_names_every_alert(sims):
    body = webhook("LlmTtftP95High", "L3", n=40, description="首字延迟超过目标，租户 acme 的实时请求受影响。" * 8)
    assert channel(sims, "llm-wecom").send(note(body, "llm-wecom")).ok
    got = sims.wecom.received[-1]
    assert got.body["msgtype"] == "markdown"
    text = got.text
    assert utf8_len(text) <= 4096
    assert text.count("**LlmTtftP95High summary.**") >= 1  # the first alert in full
    assert set(re.findall(r"instance=(i\d+)", text)) == {f"i{i}" for i in range(40)}
    assert text.rstrip().endswith("<@zhangsan>") and got.mentions == ("zhangsan",)


def test_wecom_many_alerts_count_the_ones_that_do_not_fit_and_link_alertmanager(sims):
    body = webhook("LlmTtftP95High", "L3", n=400)
    assert channel(sims, "llm-wecom").send(note(body, "llm-wecom")).ok
    text = sims.wecom.received[-1].text
    assert utf8_len(text) <= 4096
    named = set(re.findall(r"instance=(i\d+)", text))
    more = int(re.search(r"…and (\d+) more left out to fit 4,096 bytes — "
                         r"\[Alertmanager\]\(http://alertmanager.example:9093\)", text).group(1))
    assert len(named) + more == 400


def test_wecom_label_value_with_markup_goes_out_as_exact_plain_text(sims):
    hostile = '<font color="info">ok</font>[x](http://evil)'
    body = webhook("LlmCancellationRatioHigh", "L3", extra={"tenant": hostile})
    assert channel(sims, "llm-wecom").send(note(body, "llm-wecom")).ok
    got = sims.wecom.received[-1]
    assert got.body["msgtype"] == "text" and got.body["text"]["mentioned_list"] == ["zhangsan"]
    assert f"tenant: {hostile}" in got.body["text"]["content"]  # exactly as sent, shown as plain text
    assert "＜" not in got.text and got.mentions == ("zhangsan",)


@pytest.mark.parametrize("mode, retryable, reason", [
    ("rate_limit", True, "rate_limited"), ("bad_key", False, "bad_key"), ("down", True, "http_5xx"),
])
def test_wecom_errcode_is_checked_in_every_http_200(sims, mode, retryable, reason):
    sims.wecom.set_mode(mode)
    r = channel(sims, "llm-wecom").send(note(webhook("X", "L3"), "llm-wecom"))
    assert (r.ok, r.retryable, r.reason) == (False, retryable, reason)


def test_wecom_too_long_answer_is_retryable_and_every_later_message_is_smaller(sims):
    ch = channel(sims, "llm-wecom")
    sims.wecom.max_markdown_bytes = 1500  # the provider measures stricter than we do
    n = note(webhook("X", "L3", n=60, description="d" * 300), "llm-wecom")
    results = [ch.send(n) for _ in range(3)]
    first = results[0]
    assert (first.ok, first.retryable, first.reason) == (False, True, "too_long")
    assert "errcode 40058" in first.detail and "now rendering within" in first.detail
    assert [r.ok for r in results] == [False, False, True]  # halved twice: 3,440 → 1,695 → 846 bytes
    assert ch.send(note(webhook("Y", "L3", n=60, description="d" * 300), "llm-wecom")).ok  # remembered


# ------------------------------------------------------------------------------------ answers table
@pytest.mark.parametrize("name", ["phone", "call", "oncall-slack", "llm-wecom"])
@pytest.mark.parametrize("mode, retryable, reason", [
    ("down", True, "http_5xx"), ("rate_limit", True, "rate_limited"), ("bad_key", False, "bad_key"),
])
def test_answers_table(sims, name, mode, retryable, reason):
    sims.set_mode(mode)
    r = channel(sims, name).send(note(webhook("X", "L1"), name))
    assert (r.ok, r.retryable, r.reason) == (False, retryable, reason)


@pytest.mark.parametrize("name", ["phone", "call", "oncall-slack", "llm-wecom"])
def test_unreachable_provider_is_retryable_and_no_secret_leaks(sims, name, caplog):
    spec = make_spec(sims)
    cspec = spec.channels[name]
    dead = "http://127.0.0.1:9/"  # discard port: connection refused
    if cspec.type == "pagerduty":
        cspec = dataclasses.replace(cspec, url=Secret(literal=dead + "v2/enqueue?token=SEKRET-PD"))
    else:
        cspec = dataclasses.replace(cspec, url=Secret(literal=dead + "hook?key=SEKRET-HOOK"))
    with caplog.at_level(logging.DEBUG):
        r = build_channel(name, cspec).send(note(webhook("X", "L1"), name))
    assert (r.ok, r.retryable, r.reason) == (False, True, "connection")
    for text in (r.detail, caplog.text):
        assert "SEKRET" not in text and sims.pagerduty.routing_key not in text


def _closed(url: str, port: int) -> str:
    """`url` with its host:port replaced by 127.0.0.1:`port` (path and query, the secret parts, kept)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


def _secrets(sims, cspec) -> set[str]:
    """What must never be printed of a channel's destination: the secret parts of its URL (the URL, a Slack
    hook's token path segment, a WeCom key), its path and query, the PagerDuty key and the voice token."""
    url = cspec.url.reveal()
    parts = urlsplit(url)
    out = secret_parts(url) | {parts.path} | ({parts.query} if parts.query else set())
    return out | {sims.pagerduty.routing_key, sims.voice.token}


@pytest.mark.parametrize("name", ["phone", "call", "oncall-slack", "llm-wecom"])
def test_a_send_that_cannot_connect_logs_its_destination_host_and_receiver_never_the_secret(sims, name, caplog):
    port = free_port()  # nothing listens there: connection refused
    spec = make_spec(sims)
    cspec = spec.channels[name]
    cspec = dataclasses.replace(cspec, url=Secret(literal=_closed(cspec.url.reveal(), port)))
    with caplog.at_level(logging.WARNING):
        r = build_channel(name, cspec).send(note(webhook("X", "L1"), name))
    assert (r.ok, r.reason) == (False, "connection")
    assert f"127.0.0.1:{port}" in r.detail and "Connection refused" in r.detail
    lines = [rec.getMessage() for rec in caplog.records if rec.name.endswith("channels.base")]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and f"channel {name} " in lines[0], lines
    for secret in _secrets(sims, cspec):
        assert secret not in lines[0] and secret not in r.detail, secret


def test_the_delivery_worker_names_the_destination_host_and_receiver_of_a_failed_send(sims, tmp_path, caplog):
    port = free_port()
    data = spec_data(sims, retry_initial="100ms", retry_max="200ms")
    data["channels"]["oncall-slack"]["url"] = _closed(sims.slack_url, port)
    svc = NotifierService(spec_from_dict(data), tmp_path / "d", port=0).start()
    try:
        with caplog.at_level(logging.WARNING):
            r = requests.post(svc.url + "/alerts", json=webhook("X", "L2"), headers=AUTH, timeout=10)
            assert r.status_code == 200, r.text
            retried = wait_for(lambda: [rec.getMessage() for rec in caplog.records
                                        if rec.getMessage().startswith("delivery to oncall-slack failed")],
                               what="the worker's retry line")
    finally:
        svc.stop()
    assert f"127.0.0.1:{port}" in retried[0] and "connection" in retried[0], retried
    for secret in secret_parts(data["channels"]["oncall-slack"]["url"]) | {urlsplit(sims.slack_url).path}:
        assert secret not in caplog.text, secret


@pytest.mark.parametrize("kind, field", [("wecom", "url"), ("slack", "url"), ("voice", "url"),
                                         ("pagerduty", "routing_key"), ("voice", "headers")])
def test_missing_secret_is_retryable_and_names_the_variable_not_a_value(sims, monkeypatch, kind, field):
    # Retryable: a secret file may appear (mounted late, rotated); max_delivery_age bounds the retries.
    from inferwatch.spec import spec_from_dict

    monkeypatch.delenv("NOPE_SECRET", raising=False)
    data = {"type": kind, "url": sims.url + "/x", "routing_key": "k" * 32}
    if field == "headers":
        data["headers"] = {"Authorization": "${NOPE_SECRET}"}
    else:
        data[field] = "${NOPE_SECRET}"
    spec = spec_from_dict({"channels": {"c": data}})
    r = build_channel("c", spec.channels["c"]).send(note(webhook("X", "L1"), "c"))
    assert (r.ok, r.retryable, r.reason) == (False, True, "secret_missing")
    assert "NOPE_SECRET" in r.detail


# ----------------------------------------------------------------------------- how channels are built
def test_each_channel_declares_its_rate_and_the_worker_default_uses_it():
    rates = {kind: cls.rate_per_minute for kind, cls in channel_classes().items()}
    assert rates == {"wecom": 20, "slack": 60, "pagerduty": 120, "voice": 10}
    assert all(default_rate(kind) == rate for kind, rate in rates.items())


@pytest.mark.parametrize("name", ["phone", "call", "oncall-slack", "llm-wecom"])
def test_one_http_session_per_channel_with_the_inferwatch_user_agent(sims, name):
    ch = channel(sims, name)
    provider = {"phone": sims.pagerduty, "call": sims.voice, "oncall-slack": sims.slack, "llm-wecom": sims.wecom}[name]
    for i in range(2):
        assert ch.send(note(webhook(f"Session{i}", "L1", group=f"s{i}"), name)).ok
    first, second = provider.received[-2:]
    assert first.headers["User-Agent"] == second.headers["User-Agent"] == f"inferwatch/{version('inferwatch')}"
    assert first.peer == second.peer  # the same connection, kept alive by the channel's one session
    assert channel(sims, name).session is not ch.session  # one session per channel, not one shared
