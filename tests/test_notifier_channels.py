"""Channels against local servers answering as PagerDuty, Slack, WeCom and a voice gateway do:
content and limits per provider, a table of answers → (ok, retryable, reason), and no secret in errors.
Plus the shared helpers: HTTP classification, truncation by runes/bytes, redaction."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings, strategies as st

from inferwatch.notifier.channels import build_channel
from inferwatch.notifier.channels.base import (classify_http, fit_lines, redact, truncate_bytes, truncate_runes,
                                               utf8_len)
from inferwatch.notifier.channels.pagerduty import dedup_key
from inferwatch.notifier.model import Notification, message_from_dict
from inferwatch.testing.channels import ProviderSimulators

from notifier_support import fixture_body, make_spec, webhook


@pytest.fixture(scope="module")
def sims():
    with ProviderSimulators() as s:
        yield s


@pytest.fixture(autouse=True)
def _reset(sims):
    sims.set_mode("ok")
    yield
    sims.set_mode("ok")


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
def test_truncate_bytes_never_breaks_a_character(text, limit):
    out = truncate_bytes(text, limit)
    assert utf8_len(out) <= limit
    out.encode("utf-8")  # a lone surrogate or half character would fail here
    if utf8_len(text) <= limit:
        assert out == text
    else:
        assert out.endswith("…") or out == ""


@given(st.text(), st.integers(min_value=1, max_value=300))
@settings(max_examples=200, deadline=None)
def test_truncate_runes_counts_code_points(text, limit):
    out = truncate_runes(text, limit)
    assert len(out) <= limit
    assert out == text or out.endswith("…")


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
def test_slack_blocks_have_title_severity_labels_description_and_links(sims):
    body = webhook("TritonModelNotReady", "L2", n=3, extra={"model": "classifier"},
                   description="model <classifier> & v2 " + "d" * 4000)
    assert channel(sims, "oncall-slack").send(note(body, "oncall-slack")).ok
    msg = sims.slack.received[-1].body
    blocks = msg["blocks"]
    assert blocks[0]["type"] == "header" and "[FIRING:3] TritonModelNotReady" in blocks[0]["text"]["text"]
    fields = [f["text"] for f in blocks[1]["fields"]]
    assert "*severity*\ncritical" in fields and "*model*\nclassifier" in fields
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    assert all(len(s) <= 3000 for s in sections)
    assert "model &lt;classifier&gt; &amp; v2" in sections[0]  # escaped, so no fake link or mention
    buttons = {e["text"]["text"]: e["url"] for b in blocks if b["type"] == "actions" for e in b["elements"]}
    assert buttons == {"Runbook": "https://runbooks.example/TritonModelNotReady.md",
                       "Alertmanager": "http://alertmanager.example:9093",
                       "Prometheus": "http://prometheus.example/graph"}


def test_slack_resolved_and_many_alerts_stay_within_50_blocks(sims):
    body = webhook("TritonQueueTimeP95High", "L2", n=120, status="resolved")
    assert channel(sims, "oncall-slack").send(note(body, "oncall-slack")).ok
    msg = sims.slack.received[-1]
    assert len(msg.body["blocks"]) <= 50
    assert "[RESOLVED:120]" in msg.text and "…and 100 more alert(s)" in msg.text


def test_the_real_truncated_fixture_renders_on_every_channel(sims):
    body = fixture_body()  # one alert without annotations or generatorURL, truncatedAlerts=1
    for name in ("phone", "call", "oncall-slack", "llm-wecom"):
        assert channel(sims, name).send(note(body, name)).ok, name
    assert "[FIRING:3] GpuTemperatureHigh" in sims.slack.received[-1].text
    assert "…and 1 more" in sims.wecom.received[-1].text


# ------------------------------------------------------------------------------------------------ WeCom
def test_wecom_markdown_fits_4096_bytes_with_chinese_text_and_counts_the_rest(sims):
    body = webhook("LlmTtftP95High", "L3", n=40, description="首字延迟超过目标，租户 acme 的实时请求受影响。" * 8)
    assert channel(sims, "llm-wecom").send(note(body, "llm-wecom")).ok
    text = sims.wecom.received[-1].text
    assert utf8_len(text) <= 4096
    shown = text.count("**LlmTtftP95High summary.**")
    more = int(text.split("…and ")[1].split(" more")[0])
    assert shown + more == 40 and shown >= 1
    assert "[Alertmanager](http://alertmanager.example:9093)" in text  # the link is whole
    assert text.rstrip().endswith("<@zhangsan>")


def test_wecom_escapes_label_values_so_they_cannot_inject_markup(sims):
    body = webhook("LlmCancellationRatioHigh", "L3", extra={"tenant": '<font color="info">ok</font>[x](http://evil)'})
    assert channel(sims, "llm-wecom").send(note(body, "llm-wecom")).ok
    text = sims.wecom.received[-1].text
    assert '<font color="info">ok' not in text and "[x](http://evil)" not in text
    assert "＜font" in text


@pytest.mark.parametrize("mode, retryable, reason", [
    ("rate_limit", True, "rate_limited"), ("bad_key", False, "bad_key"), ("down", True, "http_5xx"),
])
def test_wecom_errcode_is_checked_in_every_http_200(sims, mode, retryable, reason):
    sims.wecom.set_mode(mode)
    r = channel(sims, "llm-wecom").send(note(webhook("X", "L3"), "llm-wecom"))
    assert (r.ok, r.retryable, r.reason) == (False, retryable, reason)


def test_wecom_too_long_answer_is_retryable_and_shrinking_fixes_it(sims):
    ch = channel(sims, "llm-wecom")
    orig = sims.wecom.MAX_MARKDOWN_BYTES
    sims.wecom.MAX_MARKDOWN_BYTES = 3000  # the provider measures stricter than we do
    try:
        n = note(webhook("X", "L3", n=60), "llm-wecom")
        r = ch.send(n)
        assert (r.ok, r.retryable, r.reason) == (False, True, "too_long")
        n.budget_factor = 0.5
        assert ch.send(n).ok
    finally:
        sims.wecom.MAX_MARKDOWN_BYTES = orig


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
    import dataclasses

    from inferwatch.spec import Secret

    if cspec.type == "pagerduty":
        cspec = dataclasses.replace(cspec, url=Secret(literal=dead + "v2/enqueue?token=SEKRET-PD"))
    else:
        cspec = dataclasses.replace(cspec, url=Secret(literal=dead + "hook?key=SEKRET-HOOK"))
    with caplog.at_level(logging.DEBUG):
        r = build_channel(name, cspec).send(note(webhook("X", "L1"), name))
    assert (r.ok, r.retryable, r.reason) == (False, True, "connection")
    for text in (r.detail, caplog.text):
        assert "SEKRET" not in text and sims.pagerduty.routing_key not in text


def test_missing_secret_is_retryable_and_names_the_variable_not_a_value(sims, monkeypatch):
    # Retryable: a secret file may appear (mounted late, rotated); max_delivery_age bounds the retries.
    from inferwatch.spec import spec_from_dict

    monkeypatch.delenv("NOPE_WECOM_URL", raising=False)
    spec = spec_from_dict({"channels": {"w": {"type": "wecom", "url": "${NOPE_WECOM_URL}"}}})
    r = build_channel("w", spec.channels["w"]).send(note(webhook("X", "L3"), "w"))
    assert (r.ok, r.retryable, r.reason) == (False, True, "secret_missing")
    assert "NOPE_WECOM_URL" in r.detail
