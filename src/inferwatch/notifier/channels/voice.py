"""Voice-call webhook: one templated HTTP POST per firing group to a voice provider's bridge (Aliyun
Dyvms, Twilio, an internal call gateway). Firing only: nobody wants a phone call saying "resolved",
so the router never queues resolved groups for voice channels.

The body is `spec.template` (string.Template over JSON-escaped fields), default DEFAULT_BODY. Every value
is JSON-escaped without its quotes, so it arrives exactly as Alertmanager sent it and cannot break the body.
"""

from __future__ import annotations

import json

from inferwatch.notifier.channels.base import DeliveryResult, HttpChannel, reveal
from inferwatch.notifier.channels.common import alert_fields, group_title, render_template
from inferwatch.notifier.channels.text import cut_runes
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

TEXT_MAX_CHARS = 200          # text-to-speech of more than a sentence or two is not heard anyway
DEFAULT_BODY = ('{"text": "${text}", "alertname": "${alertname}", "severity": "${severity}", '
                '"node": "${node}", "count": ${count}, "dedup_key": "${group_key}"}')


class VoiceChannel(HttpChannel):
    kind = "voice"
    rate_per_minute = 10       # call gateways throttle per callee (Aliyun: 1/min per number); be conservative

    def __init__(self, name: str, spec: ChannelSpec):
        super().__init__(name, spec)
        self.template = spec.template or DEFAULT_BODY

    def build_body(self, n: Notification) -> str:
        group = n.groups[0]
        alert = (group.firing or list(group.alerts))[0]
        fields = alert_fields(alert, group)
        text = ("Escalated: " if n.escalated else "") + group_title(group)
        if fields["summary"]:
            text += ". " + fields["summary"]
        fields.update(text=cut_runes(text, TEXT_MAX_CHARS), count=str(len(group.firing) or 1),
                      group_key=group.group_key)
        # JSON-escape every value (without the quotes) so label content cannot break the body.
        escaped = {k: json.dumps(v, ensure_ascii=False)[1:-1] for k, v in fields.items()}
        escaped["count"] = fields["count"]
        return render_template(self.template, escaped)

    def deliver(self, notification: Notification) -> DeliveryResult:
        url = reveal(self.spec.url)
        headers = {k: reveal(v) for k, v in self.spec.headers.items()}
        body = self.build_body(notification).encode("utf-8")
        self.last_size = len(body)
        _, result = self.post(url, body, secrets=[url, *headers.values()], headers=headers)
        return result
