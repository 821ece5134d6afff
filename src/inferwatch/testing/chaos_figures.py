"""The figures of the HA chaos scenario, from what the channels received and what Prometheus says fired:
alerts that should have reached a channel and alerts that did, duplicate messages per channel, and the
longest delay from an alert firing to the message that accounts for it.

What counts (docs/ha.md#the-chaos-scenario):
- An alert *should* reach a channel when it fired and stayed firing for STABLE_S (Alertmanager never
  notifies an alert that resolves within its group_wait, by design), its route leads through the notifier
  (`component="notifier"` alerts page through Alertmanager's own PagerDuty integration) and the notifier's
  routes name that channel. Truth: `ALERTS{alertstate="firing"}` of every Prometheus replica, united.
- A message *accounts* for the alerts its title counts: `[FIRING:N] <alertname> <group label values> —
  ..., M more not included` (docs/notifier-messages.md), in a message of its own or a digest's group line.
  An alert reached its channel when a firing message of its group accounts for at least as many alerts as
  had fired in the group by then (so the k-th alert to fire is covered by the first message counting k).
- A *duplicate* is a message repeating a group's status and counts already received on that channel.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict

from inferwatch.deploy.alertmanager import _with_severity
from inferwatch.notifier.routing import Router
from inferwatch.spec import Spec

STABLE_S = 20.0
TITLE = re.compile(r"\[(FIRING|RESOLVED):(\d+)\+?\] (.+?)(?: — (.*))?$")  # "+": Alertmanager cut the group
_MARKUP = re.compile(r"</?font[^>]*>|`|\*\*|^#+ ")


@dataclasses.dataclass(frozen=True)
class Fired:
    """One alert as Prometheus fired it: its labels, when it first fired, how long it fired (seconds)."""

    labels: tuple[tuple[str, str], ...]
    at: float
    firing_s: float

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclasses.dataclass(frozen=True)
class Title:
    """One group as a message shows it."""

    at: float
    channel: str
    identity: str
    status: str
    present: int
    truncated: int
    dedup_key: str = ""

    @property
    def accounted(self) -> int:
        return self.present + self.truncated


def titles(text: str) -> list[tuple[str, str, int, int]]:
    """(identity, status, present, truncated) of every group title in a message's visible text."""
    out = []
    for line in text.splitlines():
        m = TITLE.search(_MARKUP.sub("", line).strip())
        if not m:
            continue
        more = re.search(r"(\d+) more not included", m.group(4) or "")
        entry = (m.group(3).strip(), m.group(1).lower(), int(m.group(2)), int(more.group(1)) if more else 0)
        if entry not in out:  # Slack repeats the title in its notification fallback text
            out.append(entry)
    return out


def received_titles(sims, channel_of_provider: dict[str, str]) -> list[Title]:
    """Every group title the simulated providers accepted, in arrival order."""
    out: list[Title] = []
    for provider in (sims.pagerduty, sims.slack, sims.wecom):
        channel = channel_of_provider[provider.name]
        with provider.lock:
            received = list(provider.received)
        for r in received:
            if provider.name == "pagerduty" and r.body.get("event_action") != "trigger":
                continue
            key = r.body.get("dedup_key", "") if provider.name == "pagerduty" else ""
            out += [Title(r.at, channel, *t, dedup_key=key) for t in titles(r.text)]
    return sorted(out, key=lambda t: t.at)


def group_identity(spec: Spec, labels: dict[str, str]) -> str:
    """The title's group part for an alert: alertname, then the values of the other labels its layer's route
    groups by, in label-name order (Alertmanager's groupLabels are a sorted map)."""
    grouping = spec.notifier.grouping[labels["layer"]]
    names = sorted(_with_severity(grouping.group_by))
    values = [labels[n] for n in names if n != "alertname" and labels.get(n)]
    return " ".join([labels.get("alertname", "")] + values)


@dataclasses.dataclass
class ChannelFigures:
    channel: str
    should: int = 0
    did: int = 0
    messages: int = 0
    duplicates: int = 0
    duplicate_keys_differ: int = 0  # PagerDuty duplicates whose dedup keys differ (must be 0)
    max_delay_s: float = 0.0
    worst: str = ""

    @property
    def lost(self) -> int:
        return self.should - self.did

    @property
    def duplicate_ratio(self) -> float:
        return self.duplicates / self.messages if self.messages else 0.0


@dataclasses.dataclass
class Figures:
    channels: dict[str, ChannelFigures]
    delays: list[tuple[float, float, str, str]]  # (fired at, delay s, channel, group) per covered alert
    uncovered: list[tuple[str, str]]              # (channel, group) of alerts no message accounted for
    not_notified: int                             # short-lived or notifier self-alerts (not counted)

    @property
    def should(self) -> int:
        return sum(c.should for c in self.channels.values())

    @property
    def did(self) -> int:
        return sum(c.did for c in self.channels.values())

    def max_delay(self, windows: list[tuple[float, float]] | None = None) -> float:
        """Longest delay; with `windows` [(start, end)], of the alerts that fired within one of them."""
        delays = [d for at, d, *_ in self.delays if windows is None or any(a <= at <= b for a, b in windows)]
        return max(delays, default=0.0)


def figures(spec: Spec, fired: list[Fired], received: list[Title]) -> Figures:
    router = Router(spec)
    expected: dict[tuple[str, str], list[float]] = defaultdict(list)
    skipped = 0
    for alert in fired:
        labels = alert.label_dict
        through_notifier = labels.get("component") != "notifier" and labels.get("layer") in spec.notifier.grouping
        if alert.firing_s < STABLE_S or not through_notifier:
            skipped += 1
            continue
        for channel in router.receivers(labels):
            expected[(channel, group_identity(spec, labels))].append(alert.at)
    channels = {c: ChannelFigures(c) for c in sorted({c for c, _ in expected} | {t.channel for t in received})}
    for t in received:
        channels[t.channel].messages += 1
    seen: Counter = Counter()
    keys: dict[tuple, str] = {}
    for t in received:
        key = (t.channel, t.identity, t.status, t.present, t.truncated)
        seen[key] += 1
        if seen[key] > 1:
            channels[t.channel].duplicates += 1
            if t.dedup_key and keys.get(key) != t.dedup_key:
                channels[t.channel].duplicate_keys_differ += 1
        keys.setdefault(key, t.dedup_key)
    by_group: dict[tuple[str, str], list[Title]] = defaultdict(list)
    for t in received:
        if t.status == "firing":
            by_group[(t.channel, t.identity)].append(t)
    delays, uncovered = [], []
    for (channel, identity), times in sorted(expected.items()):
        figs = channels[channel]
        times.sort()
        figs.should += len(times)
        messages = by_group.get((channel, identity), [])
        for k, fired_at in enumerate(times, start=1):
            cover = next((m for m in messages if m.accounted >= k and m.at >= fired_at), None)
            if cover is None:
                uncovered.append((channel, identity))
                continue
            figs.did += 1
            delay = cover.at - fired_at
            delays.append((fired_at, delay, channel, identity))
            if delay > figs.max_delay_s:
                figs.max_delay_s, figs.worst = delay, identity
    return Figures(channels, delays, uncovered, skipped)


def fired_from_ranges(results: list[list[dict]], replica_label: str = "replica") -> list[Fired]:
    """United `ALERTS{alertstate="firing"}` range-query results of several Prometheus replicas (each a list
    of {metric, values}): per alert, its first firing sample and how long it was seen firing."""
    first: dict[tuple, float] = {}
    seen: dict[tuple, set] = defaultdict(set)
    for result in results:
        for series in result:
            labels = {k: v for k, v in series["metric"].items() if k not in ("__name__", "alertstate", replica_label)}
            key = tuple(sorted(labels.items()))
            stamps = [float(t) for t, _ in series["values"]]
            if stamps:
                first[key] = min(first.get(key, stamps[0]), stamps[0])
                seen[key].update(round(t) for t in stamps)
    return [Fired(key, at, float(len(seen[key]))) for key, at in first.items()]
