"""Intake: turn one accepted webhook into planned deliveries (routing, escalation, firing-only channels)."""

from __future__ import annotations

import datetime as dt

from inferwatch.notifier.model import WebhookMessage
from inferwatch.notifier.outbox import Planned
from inferwatch.notifier.routing import Router
from inferwatch.spec import Spec

FIRING_ONLY_KINDS = ("voice",)  # nobody wants a phone call saying "resolved"


def parse_time(text: str) -> float | None:
    """RFC 3339 (Alertmanager's startsAt, nanoseconds included) → epoch seconds; None when unparsable."""
    try:
        head, _, frac = text.rstrip("Z").partition(".")
        base = dt.datetime.fromisoformat(head).replace(tzinfo=dt.timezone.utc)
        return base.timestamp() + (float("0." + frac[:9]) if frac.isdigit() else 0.0)
    except ValueError:
        return None


def plan(spec: Spec, router: Router, message: WebhookMessage, now: float) -> list[Planned]:
    """Deliveries for `message`: each matched route's receivers now; escalations when its alerts have been
    firing for `escalate_after` (measured from the earliest startsAt, so a late webhook escalates at once)."""
    out: list[Planned] = []
    seen: set[tuple[str, str]] = set()
    for m in router.match(message.labels):
        for name in m.receivers:
            if message.status == "resolved" and spec.channels[name].type in FIRING_ONLY_KINDS:
                continue
            if (name, "notify") not in seen:
                seen.add((name, "notify"))
                out.append(Planned(name, "notify", m.index, now))
        if message.status == "firing" and m.escalate_after_s is not None:
            starts = [t for t in (parse_time(a.starts_at) for a in message.firing) if t is not None]
            due = (min(starts) if starts else now) + m.escalate_after_s
            for name in m.escalate_to:
                if (name, "escalation") not in seen:
                    seen.add((name, "escalation"))
                    out.append(Planned(name, "escalation", m.index, due))
    return out
