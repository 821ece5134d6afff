"""Slack incoming webhook: Block Kit message with title, severity, key labels, description, runbook button
and Alertmanager/Prometheus links; resolved messages too.

Limits (research/alerting.md §5.2, https://api.slack.com/reference/block-kit/blocks): section text ≤ 3000
chars, ≤ 50 blocks, header text ≤ 150 chars, ≤ 10 fields of ≤ 2000 chars; ~1 message/s per webhook.
Success answer is HTTP 200 with the body `ok`; errors are 4xx with a short text (`invalid_blocks`, `no_text`,
`invalid_token`, `channel_is_archived`), 429 when rate limited.
"""

from __future__ import annotations

from inferwatch.notifier.channels.base import DeliveryResult, fit_lines, post_json, truncate_runes
from inferwatch.notifier.channels.common import (alert_fields, annotation, coalesced_title, counts_by_name,
                                                 group_title, is_http_url, key_labels, render_template)
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

SECTION_MAX_CHARS = 3000
HEADER_MAX_CHARS = 150
FIELD_MAX_CHARS = 2000
MAX_FIELDS = 10
MAX_BLOCKS = 50
MAX_ALERT_SECTIONS = 20      # one group: alerts shown as their own sections, the rest summarised
RATE_PER_MINUTE = 60         # "about one message per second" per webhook
DEFAULT_ALERT_TEMPLATE = "*${summary}*\n${description}"
EMOJI = {"firing": ":rotating_light:", "resolved": ":white_check_mark:"}


def escape(text: str) -> str:
    """Slack mrkdwn escaping: only &, < and > are control characters (api.slack.com formatting docs)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str, limit: int = SECTION_MAX_CHARS) -> dict:
    return {"type": "section", "text": {"type": "mrkdwn", "text": truncate_runes(text, limit)}}


class SlackChannel:
    kind = "slack"

    def __init__(self, name: str, spec: ChannelSpec):
        self.name = name
        self.spec = spec
        self.template = spec.template or DEFAULT_ALERT_TEMPLATE

    def _alert_text(self, alert, group) -> str:
        fields = {k: escape(v) for k, v in alert_fields(alert, group).items()}
        return render_template(self.template, fields)

    def build_message(self, n: Notification) -> dict:
        limit = int(SECTION_MAX_CHARS * n.budget_factor)
        if n.coalesced:
            return self._coalesced(n, limit)
        group = n.groups[0]
        title = group_title(group)
        if n.escalated:
            title = "[ESCALATED] " + title
        blocks: list[dict] = [{"type": "header", "text": {"type": "plain_text", "emoji": True,
                                                          "text": truncate_runes(title, HEADER_MAX_CHARS)}}]
        fields = [{"type": "mrkdwn", "text": truncate_runes(f"*{k}*\n{escape(v)}", FIELD_MAX_CHARS)}
                  for k, v in key_labels(group.common_labels)][:MAX_FIELDS]
        if fields:
            blocks.append({"type": "section", "fields": fields})
        shown = list(group.firing or group.alerts) if group.status == "firing" else list(group.alerts)
        max_sections = max(1, int(MAX_ALERT_SECTIONS * n.budget_factor))
        for alert in shown[:max_sections]:
            text = self._alert_text(alert, group)
            extra = [f"{escape(k)}={escape(v)}" for k, v in key_labels(alert.labels)
                     if group.common_labels.get(k) != v]
            if extra:
                text += "\n`" + " ".join(extra) + "`"
            blocks.append(_section(f"{EMOJI.get(alert.status, '')} {text}", limit))
        hidden = len(shown) - min(len(shown), max_sections) + group.truncated_alerts
        if hidden:
            blocks.append(_section(f"…and {hidden} more alert(s) in Alertmanager", limit))
        if n.enrichment:
            blocks.append(_section(f":mag: *Triage:* {escape(n.enrichment)}", limit))
        first = shown[0]
        buttons = []
        for text, url in (("Runbook", annotation(first, group, "runbook_url")),
                          ("Alertmanager", group.external_url), ("Prometheus", first.generator_url)):
            if is_http_url(url):
                buttons.append({"type": "button", "text": {"type": "plain_text", "text": text}, "url": url})
        if buttons:
            blocks.append({"type": "actions", "elements": buttons})
        return {"text": truncate_runes(title, SECTION_MAX_CHARS), "blocks": blocks[:MAX_BLOCKS]}

    def _coalesced(self, n: Notification, limit: int) -> dict:
        title = coalesced_title(n)
        counts = "\n".join(f"• {escape(name)} ({status}): {c}" for name, status, c in counts_by_name(n))
        lines = [f"{EMOJI.get(g.status, '')} {group_title(g, escape)}" for g in n.groups]
        listing, _ = fit_lines("*Groups:*", lines, limit, lambda k: f"…and {k} more group(s)")
        blocks = [{"type": "header", "text": {"type": "plain_text", "text": truncate_runes(title, HEADER_MAX_CHARS)}},
                  _section("*Alerts by name:*\n" + counts, limit), _section(listing, limit)]
        if is_http_url(n.groups[0].external_url):
            blocks.append({"type": "actions", "elements": [{"type": "button", "text": {
                "type": "plain_text", "text": "Alertmanager"}, "url": n.groups[0].external_url}]})
        return {"text": title, "blocks": blocks}

    def send(self, notification: Notification) -> DeliveryResult:
        try:
            url = self.spec.url.reveal()
        except Exception as exc:
            return DeliveryResult.fail("secret_missing", str(exc), retryable=True)
        resp, result = post_json(url, self.build_message(notification), timeout=self.spec.timeout.seconds,
                                 secrets=[url])
        if resp is not None and resp.status_code == 400 and "too_long" in resp.text:
            return DeliveryResult.fail("too_long", result.detail, retryable=True)
        return result
