"""Intake: turn one accepted webhook into planned deliveries (routing, escalation, firing-only channels)."""

from __future__ import annotations

from inferwatch.notifier.model import WebhookMessage, parse_time
from inferwatch.notifier.outbox import Planned
from inferwatch.notifier.routing import UNROUTED_CHANNEL, UNROUTED_ROUTE, Router
from inferwatch.spec import Spec

FIRING_ONLY_KINDS = ("voice",)  # nobody wants a phone call saying "resolved"


def plan_unrouted(spec: Spec, router: Router, message: WebhookMessage, now: float) -> list[Planned]:
    """Catch-all deliveries for a message no route matched (see routing's docstring); with no channel to
    take it, one dead letter with reason `unrouted`, so `outbox list` shows it instead of it vanishing."""
    names = [n for n in router.unrouted_receivers
             if not (message.status == "resolved" and spec.channels[n].type in FIRING_ONLY_KINDS)]
    if names:
        return [Planned(n, "notify", UNROUTED_ROUTE, now) for n in names]
    if router.unrouted_receivers:  # a resolved message whose catch-all is voice only: nothing to say
        return []
    return [Planned(UNROUTED_CHANNEL, "notify", UNROUTED_ROUTE, now, dead_reason="unrouted")]


def plan(spec: Spec, router: Router, message: WebhookMessage, now: float) -> list[Planned]:
    """Deliveries for `message`: each matched route's receivers now; escalations when its alerts have been
    firing for `escalate_after` (measured from the earliest startsAt, so a late webhook escalates at once)."""
    out: list[Planned] = []
    seen: set[tuple[str, str]] = set()
    matched = router.match(message.labels)
    if not matched:
        return plan_unrouted(spec, router, message, now)
    for m in matched:
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
