"""PagerDuty Events API v2 — the phone path (PagerDuty's escalation policy calls the on-call).

One event per group: `trigger` while firing, `resolve` when resolved, both with the same `dedup_key`
(sha256 of the Alertmanager group key, as Alertmanager's own pagerduty notifier does), so repeats from
at-least-once delivery are harmless. Facts: research/alerting.md §5.1 and
https://developer.pagerduty.com/docs/events-api-v2/trigger-events/ .
"""

from __future__ import annotations

import hashlib
import json

from inferwatch.notifier.channels.base import DeliveryResult, post_json, redact, truncate_runes
from inferwatch.notifier.channels.common import alert_fields, annotation, group_title, is_http_url, key_labels
from inferwatch.notifier.model import Notification
from inferwatch.spec import Channel as ChannelSpec

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_MAX_CHARS = 1024      # payload.summary limit (Events API v2)
DEDUP_KEY_MAX_CHARS = 255
MAX_EVENT_BYTES = 512_000     # PagerDuty rejects larger events (Alertmanager's maxEventSize)
RATE_PER_MINUTE = 120         # "approximately 120 calls/minute per integration key" (Events API rate limits)
DETAILS_MAX_ALERTS = 20
SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}  # anything else → "error"


def dedup_key(group_key: str) -> str:
    return hashlib.sha256(group_key.encode("utf-8")).hexdigest()[:DEDUP_KEY_MAX_CHARS]


class PagerDutyChannel:
    kind = "pagerduty"

    def __init__(self, name: str, spec: ChannelSpec):
        self.name = name
        self.spec = spec

    def build_event(self, n: Notification, routing_key: str) -> dict:
        group = n.groups[0]  # the worker never coalesces phone channels: one event per group
        action = "trigger" if group.status == "firing" else "resolve"
        event = {"routing_key": routing_key, "event_action": action, "dedup_key": dedup_key(group.group_key)}
        if action == "resolve":
            return event
        alerts = group.firing or list(group.alerts)
        first = alerts[0]
        summary = group_title(group)
        text = annotation(first, group, "summary") or annotation(first, group, "description")
        if text:
            summary += f" — {text}"
        if n.escalated:
            summary = "[ESCALATED] " + summary
        labels = group.common_labels
        runbook = annotation(first, group, "runbook_url")
        details = {
            "firing": [alert_fields(a, group) for a in alerts[:DETAILS_MAX_ALERTS]],
            "num_firing": len(group.firing) + group.truncated_alerts,
            "num_resolved": len(group.resolved),
            "key_labels": dict(key_labels(labels)),
        }
        if n.enrichment:
            details["triage"] = n.enrichment
        links = [{"href": u, "text": t} for u, t in ((runbook, "Runbook"), (first.generator_url, "Prometheus"),
                                                      (group.external_url, "Alertmanager")) if is_http_url(u)]
        event["payload"] = {
            "summary": truncate_runes(summary, SUMMARY_MAX_CHARS),
            "source": labels.get("node") or labels.get("instance") or labels.get("Hostname") or "inferwatch",
            "severity": SEVERITY.get(labels.get("severity", ""), "error"),
            "component": labels.get("layer", ""),
            "group": labels.get("alertname", ""),
            "class": labels.get("severity", ""),
            "custom_details": details,
        }
        event["links"] = links
        event["client"] = "inferwatch notifier"
        if is_http_url(group.external_url):
            event["client_url"] = group.external_url
        if len(json.dumps(event).encode("utf-8")) > MAX_EVENT_BYTES:
            details["firing"] = details["firing"][:1]
        return event

    def send(self, notification: Notification) -> DeliveryResult:
        try:
            key = self.spec.routing_key.reveal()
            url = self.spec.url.reveal() if self.spec.url else DEFAULT_URL
        except Exception as exc:  # SpecError: names the field, never the value
            return DeliveryResult.fail("secret_missing", str(exc), retryable=True)
        event = self.build_event(notification, key)
        resp, result = post_json(url, event, timeout=self.spec.timeout.seconds, secrets=[key, url])
        if resp is not None and resp.status_code == 400 and "routing" in resp.text.lower():
            # PagerDuty answers 400 naming routing_key when the integration key is wrong.
            return DeliveryResult.fail("bad_key", redact(result.detail, [key]), retryable=False)
        return result
