"""Text pieces the chat and phone channels share: titles, key labels, per-alert fields, templates."""

from __future__ import annotations

import string
from collections import Counter

from inferwatch.notifier.model import Alert, Notification, WebhookMessage

# Labels worth showing next to the title, in this order (the rest are in Alertmanager).
KEY_LABELS = ("severity", "layer", "node", "gpu", "triton", "model", "version", "tenant", "tier", "window", "team")


def group_title(group: WebhookMessage, esc=lambda s: s) -> str:
    """`[FIRING:2] TritonServerDown node-a` — Alertmanager's default title shape; `esc` escapes label values."""
    count = len(group.firing) if group.status == "firing" else len(group.alerts)
    count += group.truncated_alerts
    name = group.common_labels.get("alertname") or group.group_labels.get("alertname") or "alerts"
    extra = " ".join(esc(v) for k, v in group.group_labels.items() if k != "alertname" and v)
    return f"[{group.status.upper()}:{count}] {esc(name)}" + (f" {extra}" if extra else "")


def coalesced_title(n: Notification) -> str:
    return f"[{n.status.upper()}] {len(n.groups)} notifications, {n.alert_count()} alerts (coalesced)"


def counts_by_name(n: Notification) -> list[tuple[str, str, int]]:
    """(alertname, status, count) over every alert of every group, truncated alerts included."""
    counter: Counter = Counter()
    for g in n.groups:
        for a in g.alerts:
            counter[(a.name, a.status)] += 1
        if g.truncated_alerts:
            counter[(g.common_labels.get("alertname", "(truncated)"), g.status)] += g.truncated_alerts
    return [(name, status, c) for (name, status), c in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]


def key_labels(labels: dict[str, str]) -> list[tuple[str, str]]:
    return [(k, labels[k]) for k in KEY_LABELS if labels.get(k)]


def annotation(alert: Alert, group: WebhookMessage, key: str) -> str:
    return alert.annotations.get(key) or group.common_annotations.get(key, "")


def alert_fields(alert: Alert, group: WebhookMessage) -> dict[str, str]:
    """Fields a template may use: every label, plus status, summary, description, runbook_url, links."""
    fields = dict(alert.labels)
    fields.update(status=alert.status, summary=annotation(alert, group, "summary") or alert.name,
                  description=annotation(alert, group, "description"),
                  runbook_url=annotation(alert, group, "runbook_url"),
                  generator_url=alert.generator_url, alertmanager_url=group.external_url,
                  starts_at=alert.starts_at)
    fields.setdefault("severity", "")
    fields.setdefault("node", "")
    return fields


def render_template(template: str, fields: dict[str, str]) -> str:
    """string.Template with `${label}` placeholders; unknown ones stay as written (never an exception)."""
    text = string.Template(template).safe_substitute(fields)
    return "\n".join(line for line in text.splitlines() if line.strip())  # an empty annotation leaves no gap


def is_http_url(url: str) -> bool:
    return url.startswith(("http://", "https://")) and len(url) <= 3000 and not any(c.isspace() for c in url)
