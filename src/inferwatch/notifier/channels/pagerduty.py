"""PagerDuty Events API v2 — the phone path (PagerDuty's escalation policy calls the on-call).

One event per group: `trigger` while firing, `resolve` when resolved, both with the same `dedup_key`
(sha256 of the Alertmanager group key, as Alertmanager's own pagerduty notifier does), so repeats from
at-least-once delivery are harmless. Facts: https://developer.pagerduty.com/docs/events-api-v2/trigger-events/
(summary ≤ 1024 characters, dedup_key ≤ 255, event ≤ 512 KB; answers 202, 400 invalid event, 429).

`payload.custom_details` carries the whole group, every alert with all its labels and annotations:
`status`, `num_firing`, `num_resolved` (alerts present), `truncated_alerts` (alerts Alertmanager left out
of the payload; it does not say whether they fire), `firing` and `resolved` (one object per alert),
`group_labels`, `common_labels`, `common_annotations`, and `triage` when the route's hook answered.
Values are plain JSON strings, shown by PagerDuty as written. An event over the size limit keeps every
alert: the longest values are cut first (each with a marker saying how much), and only when even short
values do not fit does each alert shrink to its name and identity labels.
"""

from __future__ import annotations

import hashlib
from typing import Any

from inferwatch.notifier.channels.base import DeliveryResult, HttpChannel, json_bytes, redact, reveal, too_long
from inferwatch.notifier.channels.common import annotation, group_title, group_view, is_http_url, key_labels
from inferwatch.notifier.channels.text import MIN_FIELD_CHARS, cut_runes, fit_field_cap
from inferwatch.notifier.model import Alert, Notification, WebhookMessage
from inferwatch.spec import Channel as ChannelSpec

DEFAULT_URL = "https://events.pagerduty.com/v2/enqueue"
SUMMARY_MAX_CHARS = 1024      # payload.summary limit (Events API v2)
DEDUP_KEY_MAX_CHARS = 255
MAX_EVENT_BYTES = 512_000     # PagerDuty rejects larger events (Alertmanager's maxEventSize)
FIELD_MAX_CHARS = 16_384      # one value, at most (a longer one was already cut at intake)
SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}  # anything else → "error"
TOO_LARGE_WORDS = ("too large", "too long", "size", "exceed")


def dedup_key(group_key: str) -> str:
    return hashlib.sha256(group_key.encode("utf-8")).hexdigest()[:DEDUP_KEY_MAX_CHARS]


def _cut_all(values: dict[str, str], cap: int | None) -> dict[str, str]:
    return dict(values) if cap is None else {k: cut_runes(v, cap) for k, v in values.items()}


def alert_details(alert: Alert, cap: int | None = None) -> dict:
    """One alert in custom_details: its labels and annotations, each value cut to `cap` characters."""
    out = {"labels": _cut_all(alert.labels, cap), "annotations": _cut_all(alert.annotations, cap),
           "startsAt": alert.starts_at}
    if alert.generator_url:
        out["generatorURL"] = alert.generator_url if cap is None else cut_runes(alert.generator_url, max(cap, 200))
    return out


def alert_line(alert: Alert, group: WebhookMessage) -> str:
    """An alert in one line, for an event too large for every alert's details: name{identity labels}."""
    identity = ",".join(f'{k}="{cut_runes(v, MIN_FIELD_CHARS)}"' for k, v in sorted(alert.labels.items())
                        if group.common_labels.get(k) != v)
    return f"{cut_runes(alert.name, MIN_FIELD_CHARS)}{{{identity}}}"


class PagerDutyChannel(HttpChannel):
    kind = "pagerduty"
    rate_per_minute = 120      # "approximately 120 calls/minute per integration key" (Events API rate limits)
    size_unit = "bytes"
    min_size = 4096

    def __init__(self, name: str, spec: ChannelSpec):
        super().__init__(name, spec)

    def build_event(self, n: Notification, routing_key: str) -> dict:
        group = n.groups[0]  # the worker never coalesces phone channels: one event per group
        budget = self.budget(MAX_EVENT_BYTES, n)
        action = "trigger" if group.status == "firing" else "resolve"
        event: dict[str, Any] = {"routing_key": routing_key, "event_action": action,
                                 "dedup_key": dedup_key(group.group_key)}
        if action == "resolve":
            self.last_size = len(json_bytes(event))
            return event
        view = group_view(group, "")
        first = view.first
        summary = group_title(group)
        text = annotation(first.alert, group, "summary") or annotation(first.alert, group, "description")
        if text:
            summary += f" — {text}"
        if n.escalated:
            summary = "[ESCALATED] " + summary
        labels = group.common_labels
        links = [{"href": u, "text": t} for t, u in first.links]
        if is_http_url(group.external_url):
            links.append({"href": group.external_url, "text": "Alertmanager"})
        event["payload"] = {
            "summary": cut_runes(summary, SUMMARY_MAX_CHARS),
            "source": labels.get("node") or labels.get("instance") or labels.get("Hostname") or "inferwatch",
            "severity": SEVERITY.get(labels.get("severity", ""), "error"),
            "component": labels.get("layer", ""),
            "group": labels.get("alertname", ""),
            "class": labels.get("severity", ""),
            "custom_details": {},
        }
        event["links"] = links
        event["client"] = "inferwatch notifier"
        if is_http_url(group.external_url):
            event["client_url"] = group.external_url

        def render(cap: int) -> tuple[dict, int]:
            details = self._details(n, cap)
            event["payload"]["custom_details"] = details
            return details, len(json_bytes(event))

        details = fit_field_cap(render, budget, FIELD_MAX_CHARS)
        if details is None:
            event["payload"]["custom_details"] = {}
            details = self._compact_details(n, budget - len(json_bytes(event)))
        event["payload"]["custom_details"] = details
        self.last_size = len(json_bytes(event))
        return event

    def _details(self, n: Notification, cap: int | None) -> dict:
        group = n.groups[0]
        details = {
            "status": group.status,
            "num_firing": len(group.firing),
            "num_resolved": len(group.resolved),
            "truncated_alerts": group.truncated_alerts,
            "key_labels": dict(key_labels(group.common_labels)),
            "firing": [alert_details(a, cap) for a in group.firing],
            "resolved": [alert_details(a, cap) for a in group.resolved],
            "group_labels": _cut_all(group.group_labels, cap),
            "common_labels": _cut_all(group.common_labels, cap),
            "common_annotations": _cut_all(group.common_annotations, cap),
        }
        if n.enrichment:
            details["triage"] = n.enrichment if cap is None else cut_runes(n.enrichment, max(cap, 200))
        return details

    def _compact_details(self, n: Notification, room: int) -> dict:
        """Every alert as one line when their details cannot fit in `room` bytes; lines that do not fit
        either end in one "…and N more" entry per status."""
        group = n.groups[0]
        details = self._details(n, MIN_FIELD_CHARS)
        details.update(firing=[], resolved=[], group_labels={}, common_annotations={},
                       note="alert details did not fit PagerDuty's event size; each alert is listed by name "
                            "and identity labels, the rest are in Alertmanager")
        used = len(json_bytes(details))
        reserve = 2 * len(json_bytes(f"…and {len(group.alerts)} more")) + 2
        for status, alerts in (("firing", group.firing), ("resolved", group.resolved)):
            for i, a in enumerate(alerts):
                line = alert_line(a, group)
                cost = len(json_bytes(line)) + 1  # the string and its comma
                if used + cost + reserve > room:
                    details[status].append(f"…and {len(alerts) - i} more")
                    break
                details[status].append(line)
                used += cost
        return details

    def deliver(self, notification: Notification) -> DeliveryResult:
        key = reveal(self.spec.routing_key)
        url = reveal(self.spec.url, default=DEFAULT_URL)
        event = self.build_event(notification, key)
        resp, result = self.post(url, event, secrets=[key, url])
        if resp is None:
            return result
        text = resp.text.lower()
        if resp.status_code == 413 or (resp.status_code == 400 and any(w in text for w in TOO_LARGE_WORDS)):
            return too_long(result)
        if resp.status_code == 400 and "routing" in text:
            # PagerDuty answers 400 naming routing_key when the integration key is wrong.
            return DeliveryResult.fail("bad_key", redact(result.detail, [key]), retryable=False)
        return result
