"""Hostile values through every channel: each value reaches the provider exactly as Alertmanager sent it
(no look-alike characters, no entities in what a person sees), can mention nobody and cannot change the
markup. The request bodies are compared byte by byte with renderings written out here by hand.

Rules (docs/notifier-messages.md): Slack values go only into plain_text and rich_text (never mrkdwn), the
mrkdwn fallback `text` escapes & < >; WeCom values go into markdown as they are or as a code span, and a
value neither can show makes the message plain text; PagerDuty and voice bodies are JSON.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from inferwatch.testing.channel_text import wecom_display
from notifier_support import reset_sims, send_via, simulators, webhook  # noqa: F401 - reset_sims is an autouse fixture


@pytest.fixture(scope="module")
def sims():
    yield from simulators()

# (value, how WeCom markdown shows it: the literal form, or None = the message goes out as plain text)
HOSTILE = [
    ("llama_3_8b_instruct", "`llama_3_8b_instruct`"),                       # the example
    ("*bold* _it_ ~st~ `code`", None),                                       # markup, with a backtick
    ("<!channel> <!here> <!everyone> <@U024BE7LH> <!subteam^SAZ94GDB8>", None),  # Slack mentions
    ("<@zhangsan> <@all>", None),                                            # WeCom mentions
    ('<font color="info">ok</font> [x](http://evil.example)', None),        # WeCom markup and a link
    ("# not a heading\n> not a quote", None),                                # line-start markup, newline
    ("a & b &amp; c &lt;d&gt; &#42;", None),                                 # entities must stay as typed
    ("tab\there nul\x00 esc\x1b[31m del\x7f ls\u2028end", None),            # control characters
    ("首字延迟超过目标 租户 acme", "首字延迟超过目标 租户 acme"),                   # CJK: plain in markdown
    ("🚨🔥 GPU 😀 👩‍💻", "🚨🔥 GPU 😀 👩‍💻"),                                   # emoji, a ZWJ sequence
    (":rotating_light: firing", "`:rotating_light: firing`"),               # a shortcode stays text
    ("https://grafana.example/d/abc_def/llm?var-model=llama_3#panel_2",
     "`https://grafana.example/d/abc_def/llm?var-model=llama_3#panel_2`"),  # URL with _ and #
    ("C:\\models\\llama\\*.bin", "`C:\\models\\llama\\*.bin`"),              # backslashes
    ("1. not a list", "`1. not a list`"),
    ("model:v2 [beta](not-a-link)", "`model:v2 [beta](not-a-link)`"),
    (" leading and trailing ", None),                                        # edge spaces
]
IDS = [f"v{i}" for i in range(len(HOSTILE))]
NAME = "HostileValue"


def _body(value: str) -> dict:
    body = webhook(NAME, "L2", severity="warning", extra={"model": value})
    body["groupLabels"] = {"alertname": NAME, "model": value}
    body["alerts"][0]["annotations"].update(summary=value, description=value)
    return body


def _send(sims, channel: str, value: str):
    body = _body(value)
    return body, send_via(sims, channel, body)


def _compact(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _t(text: str, **style) -> dict:
    el = {"type": "text", "text": text}
    if style:
        el["style"] = style
    return el


def _rich(*elements) -> dict:
    return {"type": "rich_text", "elements": [{"type": "rich_text_section", "elements": list(elements)}]}


RUNBOOK = f"https://runbooks.example/{NAME}.md"
PROMETHEUS = "http://prometheus.example/graph"
ALERTMANAGER = "http://alertmanager.example:9093"


@pytest.mark.parametrize("value, _wecom", HOSTILE, ids=IDS)
def test_slack_body_is_exact_and_mentions_nobody(sims, value, _wecom):
    _, got = _send(sims, "oncall-slack", value)
    title = f"[FIRING:1] {NAME} {value}"
    button = lambda text, url: {"type": "button", "text": {"type": "plain_text", "text": text}, "url": url}  # noqa: E731
    expected = {
        "text": title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "emoji": False, "text": title}},
            _rich(_t("severity: ", bold=True), _t("warning"), _t("   layer: ", bold=True), _t("L2"),
                  _t("   node: ", bold=True), _t("node-a"), _t("   model: ", bold=True), _t(value)),
            _rich({"type": "emoji", "name": "rotating_light"}, _t(" "), _t("FIRING", bold=True), _t(" "),
                  _t(value, bold=True), _t("\n"), _t(value), _t("\n"), _t("instance="), _t("i0", code=True),
                  _t("\n"), {"type": "link", "url": RUNBOOK, "text": "Runbook"}, _t("  "),
                  {"type": "link", "url": PROMETHEUS, "text": "Prometheus"}),
            {"type": "actions", "elements": [button("Runbook", RUNBOOK), button("Alertmanager", ALERTMANAGER),
                                             button("Prometheus", PROMETHEUS)]},
        ],
    }
    assert got.raw == _compact(expected)
    assert got.mentions == ()                 # neither the blocks nor the mrkdwn fallback mention anyone
    assert got.text.count(value) >= 4         # what a person sees: the value as sent (title, labels, text)


@pytest.mark.parametrize("value, literal", HOSTILE, ids=IDS)
def test_wecom_body_is_exact_and_mentions_only_the_configured_people(sims, value, literal):
    _, got = _send(sims, "llm-wecom", value)
    if literal is not None:
        content = "\n".join([
            f'## <font color="warning">[FIRING:1] {NAME} {literal}</font>',
            f"> severity: warning · layer: L2 · node: node-a · model: {literal}",
            f'<font color="warning">FIRING</font> **{literal}**',
            literal,
            "instance=i0",
            f"[Runbook]({RUNBOOK}) [Prometheus]({PROMETHEUS})",
            "<@zhangsan>",
        ])
        expected = {"msgtype": "markdown", "markdown": {"content": content}}
    else:
        content = "\n".join([
            f"[FIRING:1] {NAME} {value}",
            f"severity: warning · layer: L2 · node: node-a · model: {value}",
            f"FIRING {value}",
            value,
            "instance=i0",
            f"Runbook: {RUNBOOK}  Prometheus: {PROMETHEUS}",
        ])
        expected = {"msgtype": "text", "text": {"content": content, "mentioned_list": ["zhangsan"]}}
    assert got.raw == _compact(expected)
    assert got.mentions == ("zhangsan",)
    shown, _ = wecom_display(got.body)
    assert shown.count(value) >= 4 and "＜" not in shown and "∗" not in shown


@pytest.mark.parametrize("value, _wecom", HOSTILE, ids=IDS)
def test_pagerduty_event_is_exact(sims, value, _wecom):
    body, got = _send(sims, "phone", value)
    alert = body["alerts"][0]
    title = f"[FIRING:1] {NAME} {value}"
    expected = {
        "routing_key": sims.pagerduty.routing_key,
        "event_action": "trigger",
        "dedup_key": hashlib.sha256(body["groupKey"].encode()).hexdigest(),
        "payload": {
            "summary": f"{title} — {value}",
            "source": "node-a", "severity": "warning", "component": "L2", "group": NAME, "class": "warning",
            "custom_details": {
                "status": "firing", "num_firing": 1, "num_resolved": 0, "truncated_alerts": 0,
                "key_labels": {"severity": "warning", "layer": "L2", "node": "node-a", "model": value},
                "firing": [{"labels": alert["labels"], "annotations": alert["annotations"],
                            "startsAt": alert["startsAt"], "generatorURL": PROMETHEUS}],
                "resolved": [],
                "group_labels": body["groupLabels"],
                "common_labels": body["commonLabels"],
                "common_annotations": {},
            },
        },
        "links": [{"href": RUNBOOK, "text": "Runbook"}, {"href": PROMETHEUS, "text": "Prometheus"},
                  {"href": ALERTMANAGER, "text": "Alertmanager"}],
        "client": "inferwatch notifier",
        "client_url": ALERTMANAGER,
    }
    assert got.raw == _compact(expected)
    assert got.body["payload"]["custom_details"]["firing"][0]["labels"]["model"] == value


@pytest.mark.parametrize("value, _wecom", HOSTILE, ids=IDS)
def test_voice_body_is_exact(sims, value, _wecom):
    body, got = _send(sims, "call", value)
    text = f"[FIRING:1] {NAME} {value}. {value}"
    raw = ('{"text": "%s", "alertname": "%s", "severity": "warning", "node": "node-a", "count": 1, '
           '"dedup_key": "%s"}') % (json.dumps(text, ensure_ascii=False)[1:-1], NAME,
                                   json.dumps(body["groupKey"], ensure_ascii=False)[1:-1])
    assert got.raw == raw.encode("utf-8")
    assert json.loads(got.raw)["text"] == text
