"""Voice-call webhook: one templated HTTP POST per firing group to a voice provider's bridge (Aliyun
Dyvms, Twilio, an internal call gateway). Firing only: nobody wants a phone call saying "resolved"
(research/alerting.md §6 item 13), so the router never queues resolved groups for voice channels.

The body is `spec.template` (string.Template over JSON-escaped fields), default DEFAULT_BODY.
"""

from __future__ import annotations

import json

import requests

from inferwatch.notifier.channels.base import (DeliveryResult, classify_exception, classify_http, redact,
                                               truncate_runes)
from inferwatch.notifier.channels.common import alert_fields, group_title, render_template
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

RATE_PER_MINUTE = 10          # call gateways throttle per callee (Aliyun: 1/min per number); be conservative
TEXT_MAX_CHARS = 200          # text-to-speech of more than a sentence or two is not heard anyway
DEFAULT_BODY = ('{"text": "${text}", "alertname": "${alertname}", "severity": "${severity}", '
                '"node": "${node}", "count": ${count}, "dedup_key": "${group_key}"}')


class VoiceChannel:
    kind = "voice"

    def __init__(self, name: str, spec: ChannelSpec):
        self.name = name
        self.spec = spec
        self.template = spec.template or DEFAULT_BODY

    def build_body(self, n: Notification) -> str:
        group = n.groups[0]
        alert = (group.firing or list(group.alerts))[0]
        fields = alert_fields(alert, group)
        text = ("Escalated: " if n.escalated else "") + group_title(group)
        if fields["summary"]:
            text += ". " + fields["summary"]
        fields.update(text=truncate_runes(text, TEXT_MAX_CHARS), count=str(len(group.firing) or 1),
                      group_key=group.group_key)
        # JSON-escape every value (without the quotes) so label content cannot break the body.
        escaped = {k: json.dumps(v, ensure_ascii=False)[1:-1] for k, v in fields.items()}
        escaped["count"] = fields["count"]
        return render_template(self.template, escaped)

    def send(self, notification: Notification) -> DeliveryResult:
        try:
            url = self.spec.url.reveal()
            headers = {k: v.reveal() for k, v in self.spec.headers.items()}
        except Exception as exc:
            return DeliveryResult.fail("secret_missing", str(exc), retryable=True)
        secrets = [url, *headers.values()]
        headers.setdefault("Content-Type", "application/json")
        try:
            resp = requests.post(url, data=self.build_body(notification).encode("utf-8"), headers=headers,
                                 timeout=self.spec.timeout.seconds)
        except requests.RequestException as exc:
            return classify_exception(exc)
        result = classify_http(resp.status_code, redact(resp.text, secrets), resp.headers.get("Retry-After"))
        return result
