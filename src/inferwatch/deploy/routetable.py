"""The effective routing table of a spec: every alert × severity (× burn-rate window) → the channels it reaches,
its escalation, and the alerts whose inhibition can silence it.

Each row follows the path a real alert takes: Alertmanager's routing tree as `inferwatch generate` writes it
(`amtree`, evaluated as Alertmanager does), then, for receivers that post to the notifier, the notifier's own
routes and catch-all (`routing.Router`). The alerts and their fixed labels (`layer`, `severity`, `window`,
`slo`, `tier`, `component`) come from the rules generated for the spec, so a window or tier the spec adds is a
row of its own. `inferwatch check` and `inferwatch notifier routes test --all` print it.
"""

from __future__ import annotations

import dataclasses

from inferwatch.spec import Spec


@dataclasses.dataclass(frozen=True)
class Row:
    """One alert variant's route. `channels`: spec channel names (or, when `external`, Alertmanager's own
    receiver, which never passes through the notifier); `escalate_to` after `escalate_after_s` seconds still
    firing; `inhibited_by`: 'AlertName (equal: labels)' of every inhibit rule that can silence it."""

    alert: str
    layer: str
    severity: str
    window: str
    tier: str
    channels: tuple[str, ...]
    escalate_to: tuple[str, ...]
    escalate_after_s: float | None
    inhibited_by: tuple[str, ...]
    external: bool
    unrouted: bool  # reached through notifier.unrouted_receivers (no route matched)


def alert_label_sets(spec: Spec) -> list[dict[str, str]]:
    """The fixed labels of every generated alert rule (alertname, layer, severity and the rule's own static
    labels), each distinct set once, in rule order."""
    from inferwatch.rules.generate import rule_groups
    from inferwatch.rules.model import Alert

    out: list[dict[str, str]] = []
    for groups in rule_groups(spec).values():
        for rule in (r for g in groups for r in g.rules if isinstance(r, Alert)):
            labels = {"alertname": rule.alert, **rule.labels, "severity": rule.severity}
            if labels not in out:
                out.append(labels)
    return out


def _may_match(matchers, labels: dict[str, str]) -> bool:
    # Matchers on labels the rule does not fix (node, gpu, model: an alert's scope) can match some alert.
    return all(m.matches(labels) for m in matchers if m.name in labels)


def effective_table(spec: Spec) -> list[Row]:
    """Rows in rule order. Raises SpecError where the rules cannot be generated for `spec`."""
    from inferwatch.deploy.alertmanager import config as alertmanager_config
    from inferwatch.notifier import amtree
    from inferwatch.notifier.routing import Router

    am = alertmanager_config(spec)
    kinds = {r["name"]: r for r in am["receivers"]}
    router = Router(spec)
    label_sets = alert_label_sets(spec)
    inhibits = [([amtree.parse_matcher(m) for m in rule["source_matchers"]],
                 [amtree.parse_matcher(m) for m in rule["target_matchers"]], rule["equal"])
                for rule in am.get("inhibit_rules", [])]
    rows = []
    for labels in label_sets:
        channels: list[str] = []
        escalate: list[str] = []
        after: float | None = None
        external = unrouted = False
        for name in amtree.receivers(am, labels):
            if not kinds[name].get("webhook_configs"):
                external = True
                channels.append(name)
                continue
            matched = router.match(labels)
            unrouted = unrouted or not matched
            channels += [c for c in router.receivers(labels) if c not in channels]
            for m in matched:
                if m.escalate_after_s is not None:
                    escalate += [c for c in m.escalate_to if c not in escalate]
                    after = m.escalate_after_s if after is None else min(after, m.escalate_after_s)
        inhibited_by: list[str] = []
        for source, target, equal in inhibits:
            if not _may_match(target, labels):
                continue
            for other in label_sets:
                if _may_match(source, other) and other != labels:
                    text = f"{other['alertname']} (equal: {', '.join(equal)})"
                    if text not in inhibited_by:
                        inhibited_by.append(text)
        rows.append(Row(labels["alertname"], labels.get("layer", ""), labels["severity"], labels.get("window", ""),
                        labels.get("tier", ""), tuple(channels), tuple(escalate), after, tuple(inhibited_by),
                        external, unrouted))
    return rows


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def render(rows: list[Row]) -> str:
    """The table as aligned text, one line per alert, severity and window (the tiers of one alert that route
    alike share a line). Columns: alert, severity, window, channels, escalation, inhibited by."""
    lines: list[tuple[str, ...]] = [("alert", "severity", "window", "channels", "escalation", "can be inhibited by")]
    seen = set()
    for r in rows:
        chans = ", ".join(r.channels) or "NONE (unrouted dead letter)"
        if r.external:
            chans += " (Alertmanager's own receiver)"
        elif r.unrouted and r.channels:
            chans += " (catch-all: no route matched)"
        esc = f"after {_duration(r.escalate_after_s)}: {', '.join(r.escalate_to)}" if r.escalate_to and \
            r.escalate_after_s is not None else "-"
        line = (r.alert, r.severity, r.window or "-", chans, esc, "; ".join(r.inhibited_by) or "-")
        if line not in seen:
            seen.add(line)
            lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(widths[i]) if i < 5 else cell for i, cell in enumerate(line)).rstrip()
                     for line in lines)
