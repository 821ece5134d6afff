"""A firing notification that is a copy of the past: every firing alert of it was already reported resolved.

Alertmanager's cluster delivers at least once: a peer acting on a snapshot taken before a group resolved
sends that group's firing state again right after another peer sent the resolution
(prometheus/alertmanager#2447, #4008). Delivered, it would reopen the incident. Prometheus gives an alert
that fires again a new start (`startsAt`), so only a copy of the past can start no later than its own
resolution's `endsAt` (same fingerprint). Such a webhook is kept (auditable, its retries deduplicated) and
not delivered. The SQLite outbox's service checks it before storing; the PostgreSQL outbox in the same
transaction as the insert (pgoutbox.py), so every replica sees every committed resolution.
"""

from __future__ import annotations

from inferwatch.notifier.model import WebhookMessage, parse_time


def stale(message: WebhookMessage, resolved: dict[str, float]) -> bool:
    """True for a firing `message` every firing alert of which has a resolution in `resolved` ({fingerprint:
    latest endsAt, epoch seconds}) no earlier than its own start. A resolved message, one without firing
    alerts, or an alert without a parseable start is never stale."""
    if message.status != "firing" or not message.firing:
        return False
    for alert in message.firing:
        started = parse_time(alert.starts_at)
        end = resolved.get(alert.fingerprint)
        if started is None or end is None or started > end:
            return False
    return True
